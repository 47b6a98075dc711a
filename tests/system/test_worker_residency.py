"""The worker's operations in-process (no Celery): real Redis, real safetensors files, real torch modules."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis

from gpu_worker.errors import (
    BadRequest,
    Cancelled,
    DoesNotFit,
    LoadFailed,
    NotResident,
    UnknownModel,
    WarmupFailed,
)
from gpu_worker.heartbeat import Heartbeat, claim_gpus, release_claims
from gpu_worker.residency import NodeWorker, WorkerOptions
from prewarm import events, keys, state
from prewarm.config import parse_devices
from prewarm.safetensors_header import read_header
from tests.model_files import (
    corrupt_header,
    model_files,
    offsets_past_eof,
    reshape_tensor,
    retype_tensor,
    tiny_catalog,
    truncate,
)
from tests.procs import wait_for

MODELS = ["tiny-lm", "tiny-lm@v2", "tiny-sharded", "tiny-mlp", "tiny-lm-wide"]


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", MODELS)


def make_worker(r: redis.Redis, catalog: Path, devices: str = "cpu:0=16MiB,cpu:1=16MiB",
                **opts: object) -> NodeWorker:
    opts.setdefault("warmup_max_passes", 4)  # a shared 2-core box is rarely "stable": keep tests quick
    w = NodeWorker(r, catalog, "node-t", parse_devices(devices), WorkerOptions(heartbeat_ttl=30, **opts))
    claim_gpus(w)
    w.heartbeat()
    return w


def size_of(catalog: Path, model: str, version: str = "v1") -> int:
    return sum(read_header(f).data_bytes for f in model_files(catalog, model, version))


def gpu_state(r: redis.Redis, gid: str) -> state.Gpu:
    g = state.read_fleet(r).gpu(gid)
    assert g is not None and g.alive
    return g


def replica(r: redis.Redis, gid: str, model: str) -> state.Replica | None:
    return next((x for x in gpu_state(r, gid).replicas if x.model == model), None)


def test_preload_infer_evict_cycle_counts_bytes(r: redis.Redis, catalog: Path) -> None:
    w = make_worker(r, catalog)
    g = w.gpu_for("cpu:0")
    size = size_of(catalog, "tiny-sharded")
    state.claim_intent(r, state.Intent("preload", "tiny-sharded", "v1", g.id, "operator", "test", time.time(),
                                       time.time() + 60))

    out = w.preload(g, "tiny-sharded", reason="test")
    assert out["state"] == "ready" and not out["noop"]
    assert out["bytes"] == size  # measured storage bytes == the headers' data bytes
    assert out["load_seconds"] > 0 and out["warmup_seconds"] > 0
    assert [x["shape"] for x in out["warmup"]] == [[1, 16], [4, 32]]  # every declared input warmed
    assert all(3 <= x["passes"] <= 4 for x in out["warmup"])  # at least the minimum, at most the bound

    pub = gpu_state(r, g.id)
    assert (pub.used_bytes, pub.free_bytes, pub.total_bytes) == (size, 16 * 2**20 - size, 16 * 2**20)
    rep = replica(r, g.id, "tiny-sharded")
    assert rep is not None and rep.state == "ready" and rep.bytes == size and rep.progress == 1.0
    assert rep.load_seconds == out["load_seconds"] and rep.warmup_seconds == out["warmup_seconds"]
    assert not r.exists(keys.intent("tiny-sharded", g.id)), "the intent is released once ready"
    assert len(r.lrange(keys.load_times("tiny-sharded"), 0, -1)) == 1
    ready = events.read(r, kind="ready", model="tiny-sharded")
    assert ready and ready[0].actor == "worker" and ready[0].numbers["bytes"] == size

    res = w.infer(g, "tiny-sharded")
    assert res["output"]["shape"] == [1, 16, 1024] and res["output"]["finite"]
    assert res["latency_ms"] > 0
    res = w.infer(g, "tiny-sharded", [[1, 2, 3, 4]])
    assert res["output"]["shape"] == [1, 4, 1024]
    res = w.infer(g, "tiny-sharded", {"shape": [2, 8]})
    assert res["output"]["shape"] == [2, 8, 1024]
    w.heartbeat()
    assert replica(r, g.id, "tiny-sharded").last_used is not None

    ev = w.evict(g, "tiny-sharded", reason="test")
    assert ev["bytes_freed"] == size and ev["versions"] == ["v1"] and not ev["noop"]
    pub = gpu_state(r, g.id)
    assert (pub.used_bytes, pub.free_bytes) == (0, 16 * 2**20)
    assert replica(r, g.id, "tiny-sharded") is None
    assert events.read(r, kind="evicted", model="tiny-sharded")[0].numbers["bytes_freed"] == size

    again = w.evict(g, "tiny-sharded")  # idempotent
    assert again["noop"] and again["bytes_freed"] == 0
    with pytest.raises(NotResident, match="tiny-sharded is not resident on node-t/cpu:0"):
        w.infer(g, "tiny-sharded")


def test_second_preload_is_a_noop_and_versions_are_separate(r: redis.Redis, catalog: Path) -> None:
    w = make_worker(r, catalog)
    g = w.gpu_for("node-t/cpu:1")
    first = w.preload(g, "tiny-lm")
    second = w.preload(g, "tiny-lm")
    assert second["noop"] and second["bytes"] == first["bytes"]
    assert len(events.read(r, kind="ready", model="tiny-lm")) == 1
    v2 = w.preload(g, "tiny-lm", "v2")
    assert not v2["noop"] and v2["version"] == "v2"
    assert gpu_state(r, g.id).used_bytes == first["bytes"] + v2["bytes"]
    assert w.infer(g, "tiny-lm", version="v1")["version"] == "v1"
    ev = w.evict(g, "tiny-lm")  # no version: every version goes
    assert sorted(ev["versions"]) == ["v1", "v2"] and ev["bytes_freed"] == first["bytes"] + v2["bytes"]
    # The other GPU was never touched.
    assert gpu_state(r, w.gpu_for("cpu:0").id).used_bytes == 0


def test_concurrent_preloads_of_one_model_load_once(r: redis.Redis, catalog: Path) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    # Paced so the loads certainly overlap: about 1.5 s of loading.
    w = make_worker(r, catalog, load_pace_bytes_per_s=size / 1.5)
    g = w.gpu_for("cpu:0")
    results: list[dict] = []
    errors: list[BaseException] = []

    def go() -> None:
        try:
            results.append(w.preload(g, "tiny-lm-wide"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(x["noop"] for x in results) == [False, True, True]
    assert len(events.read(r, kind="ready", model="tiny-lm-wide")) == 1
    assert r.llen(keys.load_times("tiny-lm-wide")) == 1
    assert gpu_state(r, g.id).used_bytes == size  # counted once


def test_progress_is_published_while_loading_and_infer_is_not_blocked(r: redis.Redis, catalog: Path) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    w = make_worker(r, catalog, load_pace_bytes_per_s=size / 4.0)
    g = w.gpu_for("cpu:0")
    w.options.load_pace_bytes_per_s = None
    w.preload(g, "tiny-mlp")
    w.options.load_pace_bytes_per_s = size / 4.0
    done = threading.Event()
    t = threading.Thread(target=lambda: (w.preload(g, "tiny-lm-wide"), done.set()))
    t.start()
    rep = wait_for(lambda: (x := replica(r, g.id, "tiny-lm-wide")) and x.state == "loading" and x.bytes > 0 and x,
                   10, what="tiny-lm-wide loading with progress")
    assert rep.total_bytes == size and 0 < rep.progress <= 1
    assert gpu_state(r, g.id).used_bytes >= size  # the load's reservation counts while it runs
    res = w.infer(g, "tiny-mlp")  # a ready model on the same GPU answers while the load runs
    assert res["output"]["shape"] == [1, 10]
    assert not done.is_set(), "infer waited for the preload"
    t.join(30)
    assert done.is_set()
    assert replica(r, g.id, "tiny-lm-wide").state == "ready"


def test_evict_while_loading_cancels_the_load(r: redis.Redis, catalog: Path) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    w = make_worker(r, catalog, load_pace_bytes_per_s=size / 5.0)
    g = w.gpu_for("cpu:0")
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: _catch(errors, w.preload, g, "tiny-lm-wide"))
    t.start()
    wait_for(lambda: (x := replica(r, g.id, "tiny-lm-wide")) and x.state == "loading", 10, what="loading")
    out = w.evict(g, "tiny-lm-wide", reason="changed my mind")
    t.join(30)
    assert out["versions"] == ["v1"] and out["bytes_freed"] == 0
    assert len(errors) == 1 and isinstance(errors[0], Cancelled) and "evicted while loading" in str(errors[0])
    assert replica(r, g.id, "tiny-lm-wide") is None
    assert gpu_state(r, g.id).used_bytes == 0


def _catch(errors: list[BaseException], fn, *args) -> None:  # noqa: ANN001
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)


# --- bad input: each fails clearly, accounting returns, the worker keeps serving ----------------------------
def _expect_failure(r: redis.Redis, w: NodeWorker, model: str, exc_type: type, *needles: str,
                    version: str | None = None) -> str:
    g = w.gpu_for("cpu:0")
    w.preload(g, "tiny-mlp")  # something resident, so "returns to where it was" is not trivially zero
    before = gpu_state(r, g.id)
    state.claim_intent(r, state.Intent("preload", model, version or "v1", g.id, "operator", "t", time.time(),
                                       time.time() + 60))
    with pytest.raises(exc_type) as info:
        w.preload(g, model, version)
    msg = str(info.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    after = gpu_state(r, g.id)
    assert (after.used_bytes, after.free_bytes) == (before.used_bytes, before.free_bytes)
    rep = replica(r, g.id, model)
    assert rep is not None and rep.state == "failed" and rep.error == msg and rep.bytes == 0
    assert not r.exists(keys.intent(model, g.id)), "a failed preload releases its intent"
    failed = events.read(r, kind="failed", model=model)
    assert failed and failed[0].reason == msg and failed[0].actor == "worker"
    # Still serving: a good model loads and answers, and the failed one can be cleared by evict.
    assert w.infer(g, "tiny-mlp")["output"]["finite"]
    w.preload(g, "tiny-lm")
    assert w.infer(g, "tiny-lm")["output"]["shape"] == [1, 16, 512]
    w.evict(g, model)
    assert replica(r, g.id, model) is None
    return msg


def test_truncated_file(r: redis.Redis, catalog: Path) -> None:
    f = model_files(catalog, "tiny-lm-wide")[0]
    w = make_worker(r, catalog)
    w.catalog()  # loaded while the file was whole; the copy is cut short afterwards
    truncate(f)
    _expect_failure(r, w, "tiny-lm-wide", LoadFailed, "tiny-lm-wide@v1", str(f), "past the end of the file")


def test_truncated_file_present_when_the_worker_starts(r: redis.Redis, catalog: Path) -> None:
    f = model_files(catalog, "tiny-lm-wide")[0]
    truncate(f)
    w = make_worker(r, catalog)  # the catalog's file check fails for one model: the others still serve
    _expect_failure(r, w, "tiny-lm-wide", LoadFailed, str(f), "truncated")


def test_corrupt_header(r: redis.Redis, catalog: Path) -> None:
    f = model_files(catalog, "tiny-lm-wide")[0]
    w = make_worker(r, catalog)
    w.catalog()
    corrupt_header(f)
    _expect_failure(r, w, "tiny-lm-wide", LoadFailed, str(f), "header")


def test_offsets_past_end_of_file(r: redis.Redis, catalog: Path) -> None:
    f = model_files(catalog, "tiny-sharded")[1]
    w = make_worker(r, catalog)
    w.catalog()
    name = offsets_past_eof(f)
    _expect_failure(r, w, "tiny-sharded", LoadFailed, str(f), name, "run past the end")


def test_dtype_mismatch_with_the_builder(r: redis.Redis, catalog: Path) -> None:
    f = model_files(catalog, "tiny-lm-wide")[0]
    w = make_worker(r, catalog)
    w.catalog()
    retype_tensor(f, "blocks.1.up.weight")
    _expect_failure(r, w, "tiny-lm-wide", LoadFailed, "'blocks.1.up.weight'", "expected float32", "found float16")


def test_shape_mismatch_with_the_builder(r: redis.Redis, catalog: Path) -> None:
    f = model_files(catalog, "tiny-lm-wide")[0]
    w = make_worker(r, catalog)
    w.catalog()
    reshape_tensor(f, "head.weight")
    _expect_failure(r, w, "tiny-lm-wide", LoadFailed, "'head.weight'", "[1024, 128]", "[1023, 128]")


def test_missing_shard(r: redis.Redis, catalog: Path) -> None:
    shard = model_files(catalog, "tiny-sharded")[1]
    w = make_worker(r, catalog)
    w.catalog()
    shard.unlink()
    _expect_failure(r, w, "tiny-sharded", LoadFailed, "missing shard", shard.name)


def test_unknown_model(r: redis.Redis, catalog: Path) -> None:
    w = make_worker(r, catalog)
    g = w.gpu_for("cpu:0")
    with pytest.raises(UnknownModel, match="unknown model 'nope'"):
        w.preload(g, "nope")
    rep = replica(r, g.id, "nope")
    assert rep is not None and rep.state == "failed" and "unknown model" in rep.error
    with pytest.raises(UnknownModel, match="tiny-lm@v9"):
        w.preload(g, "tiny-lm", "v9")
    assert w.preload(g, "tiny-lm")["state"] == "ready"


def test_model_bigger_than_the_gpu(r: redis.Redis, catalog: Path) -> None:
    w = make_worker(r, catalog, devices="cpu:0=2MiB")
    size = size_of(catalog, "tiny-sharded")
    msg = _expect_failure(r, w, "tiny-sharded", DoesNotFit, f"{size} bytes", "node-t/cpu:0", "can never fit")
    assert "2.0 MiB" in msg


def test_model_that_does_not_fit_the_free_budget(r: redis.Redis, catalog: Path) -> None:
    # 4.5 MiB: room for tiny-sharded's weights (3.3 MiB) and its warmup's peak (0.9 MiB, counted too) once
    # the others are evicted.
    w = make_worker(r, catalog, devices="cpu:0=4.5MiB")
    g = w.gpu_for("cpu:0")
    w.preload(g, "tiny-lm-wide")  # 2.5 MiB of 4.5
    msg = _expect_failure(r, w, "tiny-sharded", DoesNotFit, "free of 4.5 MiB", "tiny-lm-wide@v1",
                          "evict something first")
    assert "can never fit" not in msg
    w.evict(g, "tiny-lm-wide")
    w.evict(g, "tiny-lm")
    assert w.preload(g, "tiny-sharded")["state"] == "ready"  # fits once room is made


def test_preload_waits_for_a_make_room_evict_in_flight(r: redis.Redis, catalog: Path) -> None:
    # The scheduler sends a make-room evict and the preload it makes room for at once, to the same queue;
    # a thread pool may start the preload first. While the evict's intent is held, the preload waits for it.
    # 4.5 MiB: tiny-lm-wide (2.5 MiB) and its warmup's peak (0.9 MiB) fit, tiny-sharded (3.3 MiB) not beside
    # it, and alone with its warmup (0.9 MiB) it does.
    w = make_worker(r, catalog, devices="cpu:0=4.5MiB")
    g = w.gpu_for("cpu:0")
    w.preload(g, "tiny-lm-wide")
    now = time.time()
    assert state.claim_intent(r, state.Intent("evict", "tiny-lm-wide", "v1", g.id, "scheduler", "make room", now,
                                              now + 60))
    out: dict = {}
    errors: list[BaseException] = []

    def load() -> None:
        try:
            out.update(w.preload(g, "tiny-sharded"))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            errors.append(exc)

    t = threading.Thread(target=load)
    t.start()
    wait_for(lambda: (x := replica(r, g.id, "tiny-sharded")) is not None and x.state == "pending", 10,
             what="the preload waits (pending)")
    time.sleep(0.3)
    assert t.is_alive() and not errors, errors  # waiting for the evict, not failed
    w.evict(g, "tiny-lm-wide", reason="make room")  # frees the bytes, then releases its intent
    t.join(30)
    assert not errors and out["state"] == "ready", errors
    assert not [e for e in events.read(r, model="tiny-sharded") if e.kind == "failed"]


def test_builder_errors_and_bad_infer_inputs(r: redis.Redis, tmp_path: Path) -> None:
    cat = tiny_catalog(tmp_path / "m", ["tiny-lm"])
    text = cat.read_text().replace("max_seq = 64", "max_seq = 64, n_experts = 3")
    cat.write_text(text + cat.read_text().replace('id = "tiny-lm"', 'id = "ok-lm"'))
    w = make_worker(r, cat)
    g = w.gpu_for("cpu:0")
    with pytest.raises(LoadFailed, match="builder gpu_worker.demo_models:build_lm.*n_experts"):
        w.preload(g, "tiny-lm")
    w.preload(g, "ok-lm")
    with pytest.raises(BadRequest, match="dtype"):
        w.infer(g, "ok-lm", {"shape": [1, 4], "dtype": "complex"})
    with pytest.raises(BadRequest, match="max_seq"):
        w.infer(g, "ok-lm", {"shape": [1, 65]})
    # The catalog's bounds on a warmup input bound a request's too (prewarm.catalog_bounds.check_input_shape).
    with pytest.raises(BadRequest, match=r"inputs shape \[4096, 4096\] has 16,777,216 elements; at most 4,194,304"):
        w.infer(g, "ok-lm", {"shape": [4096, 4096]})
    with pytest.raises(BadRequest, match=r"has 9 dims; at most 8 \(MAX_INPUT_DIMS\)"):
        w.infer(g, "ok-lm", {"shape": [1] * 9})
    with pytest.raises(BadRequest, match="GPU 'cuda:7' is not served"):
        w.gpu_for("cuda:7")
    assert w.infer(g, "ok-lm")["output"]["finite"]


def test_heartbeat_expires_and_a_new_worker_clears_stale_claims(r: redis.Redis, catalog: Path) -> None:
    opts = WorkerOptions(heartbeat_seconds=0.2, heartbeat_ttl=2.0)
    w = NodeWorker(r, catalog, "node-h", parse_devices("cpu:0=16MiB"), opts)
    claim_gpus(w)
    hb = Heartbeat(w).start()
    g = w.gpu_for("cpu:0")
    w.preload(g, "tiny-lm")
    state.claim_intent(r, state.Intent("preload", "tiny-mlp", "v1", g.id, "scheduler", "t", time.time(),
                                       time.time() + 600))
    time.sleep(2.5)  # past the TTL: the heartbeat keeps it alive
    assert replica(r, g.id, "tiny-lm").state == "ready"
    hb.stop()  # as if the process died: no more beats, nothing cleaned up
    wait_for(lambda: state.read_fleet(r).gpu(g.id) is not None and not state.read_fleet(r).gpu(g.id).alive, 10,
             what="GPU to go stale")
    assert state.read_fleet(r).replicas() == []

    w2 = NodeWorker(r, catalog, "node-h", parse_devices("cpu:0=16MiB"), opts)
    claim_gpus(w2)  # waits out the dead worker's claim, then clears stale intents
    assert not r.exists(keys.intent("tiny-mlp", g.id))
    w2.heartbeat()
    fresh = gpu_state(r, g.id)
    assert fresh.worker == w2.worker_id and fresh.used_bytes == 0 and fresh.replicas == []
    release_claims(w2)
    assert not r.exists(keys.worker_lock(g.id))


def test_the_gpu_record_gives_its_beat_period_so_readers_can_tell_a_late_beat(r: redis.Redis,
                                                                              catalog: Path) -> None:
    w = make_worker(r, catalog, "cpu:0=16MiB", heartbeat_seconds=2.0)  # (it beats once: no thread)
    g = w.gpu_for("cpu:0")
    w.preload(g, "tiny-lm")  # publishes between beats write the same record (state.gpu_info)
    beat = gpu_state(r, g.id)
    assert beat.heartbeat_seconds == 2.0
    assert state.read_fleet(r, now=beat.last_heartbeat + 5.5).gpu(g.id).fresh
    late = state.read_fleet(r, now=beat.last_heartbeat + 6.5)  # three beats missed; its key lives 30 s
    assert late.gpu(g.id).alive and not late.gpu(g.id).fresh and late.placeable() == []


def test_a_live_workers_claim_is_not_taken(r: redis.Redis, catalog: Path) -> None:
    from gpu_worker.heartbeat import ClaimTaken

    a = NodeWorker(r, catalog, "node-c", parse_devices("cpu:0=16MiB"), WorkerOptions(heartbeat_ttl=30))
    claim_gpus(a)
    b = NodeWorker(r, catalog, "node-c", parse_devices("cpu:0=16MiB"), WorkerOptions(heartbeat_ttl=30))
    with pytest.raises(ClaimTaken, match="served by another live worker"):
        claim_gpus(b, wait=0.3)
    assert r.get(keys.worker_lock("node-c/cpu:0")).decode() == a.worker_id


def test_published_records_are_plain_json(r: redis.Redis, catalog: Path) -> None:
    w = make_worker(r, catalog)
    g = w.gpu_for("cpu:0")
    w.preload(g, "tiny-mlp", reason="because")
    raw = r.hgetall(keys.replicas(g.id))
    rec = json.loads(raw[b"tiny-mlp@v1"])
    assert rec["state"] == "ready" and rec["reason"] == "because" and rec["gpu"] == g.id
    assert r.pttl(keys.replicas(g.id)) > 0 and r.pttl(keys.gpu(g.id)) > 0


def _prefixed_mlp_catalog(folder: Path, builders: dict[str, str]) -> Path:
    """Models whose modules wrap tiny-mlp as `.mlp`: the same weights under an `mlp.` prefix."""
    from safetensors.torch import save_file

    from gpu_worker.demo_models import random_state_dict
    from tests.model_files import small_model

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"mlp.{k}": v for k, v in random_state_dict(small_model("tiny-mlp")).items()}
    save_file(tensors, str(folder / "wrapped.safetensors"))
    parts = [f'[[models]]\nid = "{mid}"\nversion = "v1"\nweights = "wrapped.safetensors"\n'
             f'builder = "tests.builders:{fn}"\n'
             '[[models.warmup]]\nshape = [1, 64]\ndtype = "float32"\n'
             '[[models.warmup]]\nshape = [8, 64]\ndtype = "float32"\n' for mid, fn in builders.items()]
    (folder / "catalog.toml").write_text("\n".join(parts))
    return folder / "catalog.toml"


def test_builder_buffers_warmup_failures_and_non_modules(r: redis.Redis, tmp_path: Path) -> None:
    cat = _prefixed_mlp_catalog(tmp_path / "w", {"buffered": "build_with_buffer", "exploding": "build_exploding",
                                                 "notmodule": "build_not_a_module"})
    w = make_worker(r, cat)
    g = w.gpu_for("cpu:0")
    weights = tmp_path / "w" / "wrapped.safetensors"
    size = read_header(weights).data_bytes

    out = w.preload(g, "buffered")  # built for real on the device: its buffer exists, the weights assigned
    assert out["bytes"] == size + 10 * 4  # the buffer's bytes are measured too
    res = w.infer(g, "buffered", {"shape": [2, 64]})
    assert res["output"]["shape"] == [2, 10]

    with pytest.raises(WarmupFailed) as info:
        w.preload(g, "exploding")
    msg = str(info.value)
    assert "warmup input #1 (shape [8, 64], float32)" in msg and "batch of 8 is not supported" in msg
    assert gpu_state(r, g.id).used_bytes == out["bytes"]  # the exploded one's bytes were returned
    assert replica(r, g.id, "exploding").state == "failed"

    with pytest.raises(LoadFailed, match="returned dict, not a torch.nn.Module"):
        w.preload(g, "notmodule")
    assert weights.exists() and gpu_state(r, g.id).used_bytes == out["bytes"]


def test_evict_hands_the_memory_back_to_the_os(r: redis.Redis, tmp_path: Path) -> None:
    """Not only the count: the process's resident memory falls by about the model's bytes."""
    import psutil

    from gpu_worker import demo_models as dm

    model = dm._mlp("mlp-40mb", "v1", 256, 1024, 10, 10)
    folder = tmp_path / "big"
    weights = dm.write_weights(model, folder / "mlp-40mb")
    (folder / "catalog.toml").write_text(dm.catalog_entry(model, f"mlp-40mb/{weights}"))
    w = make_worker(r, folder / "catalog.toml", devices="cpu:0=256MiB")
    g = w.gpu_for("cpu:0")
    proc = psutil.Process()
    size = w.preload(g, "mlp-40mb")["bytes"]
    assert size > 40e6
    loaded = proc.memory_info().rss
    assert w.evict(g, "mlp-40mb")["bytes_freed"] == size
    after = proc.memory_info().rss
    assert loaded - after > 0.8 * size, f"RSS fell by {loaded - after} bytes of {size}"


def test_queued_preloads_show_pending_and_an_evict_cancels_them(r: redis.Redis, catalog: Path) -> None:
    from gpu_worker.errors import Busy

    size = size_of(catalog, "tiny-lm-wide")
    w = make_worker(r, catalog, load_pace_bytes_per_s=size / 3.0, max_loads_per_gpu=1)
    g = w.gpu_for("cpu:0")
    t = threading.Thread(target=w.preload, args=(g, "tiny-lm-wide"))
    t.start()
    wait_for(lambda: (x := replica(r, g.id, "tiny-lm-wide")) and x.state == "loading", 10, what="loading")
    with pytest.raises(Busy, match="queued"):
        w.preload(g, "tiny-mlp", defer=True, task_id="t-mlp")
    with pytest.raises(Busy, match="queued"):
        w.preload(g, "tiny-lm", defer=True, task_id="t-lm")
    with pytest.raises(Busy, match="already loading"):
        w.preload(g, "tiny-lm-wide", defer=True, task_id="t-dup")
    for m in ("tiny-mlp", "tiny-lm"):
        rec = replica(r, g.id, m)
        assert rec is not None and rec.state == "pending" and rec.bytes == 0
    assert gpu_state(r, g.id).used_bytes == size  # a queued preload holds nothing

    ev = w.evict(g, "tiny-lm")  # while it waits in the queue: gone, and its task will not load it later
    assert ev["versions"] == ["v1"] and ev["bytes_freed"] == 0 and replica(r, g.id, "tiny-lm") is None
    with pytest.raises(Cancelled, match="cancelled by an evict while it waited"):
        w.preload(g, "tiny-lm", defer=True, task_id="t-lm")

    t.join(30)
    out = w.preload(g, "tiny-mlp", defer=True, task_id="t-mlp")  # its turn: it loads now
    assert out["state"] == "ready" and not out["noop"]
    assert w.preload(g, "tiny-lm-wide", defer=True, task_id="t-dup")["noop"]
    assert w.preload(g, "tiny-lm", defer=True, task_id="t-new")["state"] == "ready"  # a new preload is fine
