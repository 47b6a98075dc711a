"""A real `prewarm worker` process on Celery: tasks sent by name, state read back from Redis, the CLI, crashes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from prewarm import celery_app, events, keys, metrics_defs, state
from prewarm.dispatch import Dispatcher
from prewarm.safetensors_header import read_header
from prewarm.store import cold_starts, histograms, load_times
from tests import procs
from tests.model_files import model_files, reshape_tensor, tiny_catalog
from tests.procs import REPO, WorkerProc, gpu_gone, wait_for

worker_factory = procs.worker_factory  # the fixture, used by name

MODELS = ["tiny-lm", "tiny-sharded", "tiny-mlp", "tiny-lm-wide"]


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", MODELS)


@pytest.fixture
def celery(redis_url: str) -> Iterator[Celery]:
    app = celery_app.make_celery(redis_url)
    yield app
    app.close()


def size_of(catalog: Path, model: str) -> int:
    return sum(read_header(f).data_bytes for f in model_files(catalog, model))


def gpu(r: redis.Redis, gid: str) -> state.Gpu:
    g = state.read_fleet(r).gpu(gid)
    assert g is not None
    return g


def rep(r: redis.Redis, gid: str, model: str) -> state.Replica | None:
    g = state.read_fleet(r).gpu(gid)
    return next((x for x in g.replicas if x.model == model), None) if g else None


def test_preload_infer_evict_through_celery(r: redis.Redis, celery: Celery, catalog: Path, worker_factory) -> None:
    w: WorkerProc = worker_factory(catalog, devices="cpu:0=64MiB,cpu:1=64MiB")
    fleet = state.read_fleet(r)
    assert [g.id for g in fleet.alive()] == ["node-a/cpu:0", "node-a/cpu:1"]
    target = fleet.gpu("node-a/cpu:1")
    assert target.queue == "gpu.node-a.cpu:1" and target.total_bytes == 64 * 2**20 and target.used_bytes == 0
    size = size_of(catalog, "tiny-sharded")

    d = Dispatcher(r, celery).preload("tiny-sharded", "v1", target, actor="operator", reason="test")
    assert d.sent
    out = celery.AsyncResult(d.task_id).get(timeout=60)
    assert out["state"] == "ready" and out["gpu"] == target.id and out["bytes"] == size
    g = gpu(r, target.id)
    assert g.used_bytes == size and g.free_bytes == 64 * 2**20 - size
    assert rep(r, target.id, "tiny-sharded").state == "ready"
    assert gpu(r, "node-a/cpu:0").used_bytes == 0, "the task ran on the GPU whose queue it was sent to"
    assert not r.exists(keys.intent("tiny-sharded", target.id))

    res = celery.send_task(celery_app.INFER, args=["tiny-sharded"], kwargs={"inputs": [[5, 6, 7]]},
                           queue=target.queue).get(timeout=30)
    assert res["output"]["shape"] == [1, 3, 1024] and res["latency_ms"] > 0

    again = celery.send_task(celery_app.PRELOAD, args=["tiny-sharded", "v1"], queue=target.queue).get(timeout=30)
    assert again["noop"]

    d = Dispatcher(r, celery).evict("tiny-sharded", "v1", target, actor="operator", reason="test")
    ev = celery.AsyncResult(d.task_id).get(timeout=30)
    assert ev["bytes_freed"] == size
    assert gpu(r, target.id).used_bytes == 0 and rep(r, target.id, "tiny-sharded") is None

    # Not resident any more: a clear error, and the worker carries on.
    with pytest.raises(Exception, match="tiny-sharded is not resident on node-a/cpu:1"):
        celery.send_task(celery_app.INFER, args=["tiny-sharded"], queue=target.queue).get(timeout=30)
    with pytest.raises(Exception, match="unknown model 'nope'"):
        celery.send_task(celery_app.PRELOAD, args=["nope", "v1"], queue=target.queue).get(timeout=30)
    assert rep(r, target.id, "nope").state == "failed"
    assert w.alive()
    assert celery.send_task(celery_app.PRELOAD, args=["tiny-mlp", "v1"], kwargs={"gpu": "cpu:0"},
                            queue=target.queue).get(timeout=30)["gpu"] == "node-a/cpu:0"  # gpu kwarg wins

    # Three preloads of one model at once (a redelivery, a double click): loaded once, all answered ready.
    dupes = [celery.send_task(celery_app.PRELOAD, args=["tiny-lm-wide", "v1"], queue=target.queue)
             for _ in range(3)]
    outs = [x.get(timeout=60) for x in dupes]
    assert [o["state"] for o in outs] == ["ready"] * 3 and sum(not o["noop"] for o in outs) == 1
    assert len(events.read(r, kind="ready", model="tiny-lm-wide")) == 1
    assert gpu(r, target.id).used_bytes == size_of(catalog, "tiny-lm-wide")


# The worker counts these when a replica turns ready (the ETA error only when a route answer promised one).
COUNTED_AT_READY = (metrics_defs.COLD_START_DURATION, metrics_defs.MODEL_LOAD, metrics_defs.MODEL_WARMUP)


def test_a_replica_turning_ready_closes_its_cold_start_and_records_its_load_once(
        r: redis.Redis, celery: Celery, catalog: Path, worker_factory) -> None:
    """The worker records what the histograms count when the replica turns ready: nobody scrapes /metrics
    and no route lookup notices it, and each event is still counted, once."""
    worker_factory(catalog, devices="cpu:0=64MiB")
    target = gpu(r, "node-a/cpu:0")
    seen = time.time()
    assert cold_starts.open_episode(r, "tiny-lm", "v1", seen)  # a route lookup found it cold
    d = Dispatcher(r, celery).preload("tiny-lm", "v1", target, actor="router", reason="test", kind="demand")
    out = celery.AsyncResult(d.task_id).get(timeout=60)
    assert out["state"] == "ready"
    ready = rep(r, target.id, "tiny-lm")
    assert ready is not None and ready.state == "ready"
    c = histograms.read(r, COUNTED_AT_READY)
    assert [c[x.name].count for x in COUNTED_AT_READY] == [1, 1, 1]
    assert c[metrics_defs.MODEL_LOAD.name].sum == pytest.approx(out["load_seconds"])
    assert cold_starts.read_open(r) == {}
    assert cold_starts.last_durations(r)["tiny-lm"] == pytest.approx(ready.since - seen, abs=0.002)
    assert load_times.recent(r, ["tiny-lm"])["tiny-lm"].load == [
        pytest.approx(out["load_seconds"] + out["warmup_seconds"], abs=1e-3)]
    # A repeat preload of the resident replica loads nothing: nothing more is counted.
    assert celery.send_task(celery_app.PRELOAD, args=["tiny-lm", "v1"], queue=target.queue).get(timeout=30)["noop"]
    c = histograms.read(r, COUNTED_AT_READY)
    assert [c[x.name].count for x in COUNTED_AT_READY] == [1, 1, 1]


def test_infer_runs_while_a_preload_loads_on_the_same_gpu(r: redis.Redis, celery: Celery, catalog: Path,
                                                          worker_factory) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    w = worker_factory(catalog, devices="cpu:0=64MiB",
                       env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(int(size / 60))})  # a minute of loading
    q = w.queues["node-a/cpu:0"]
    small = celery.send_task(celery_app.PRELOAD, args=["tiny-mlp", "v1"], queue=q)
    small.get(timeout=60)  # tiny-mlp is tiny: its own pace wait is negligible
    slow = celery.send_task(celery_app.PRELOAD, args=["tiny-lm-wide", "v1"], queue=q)
    wait_for(lambda: (x := rep(r, "node-a/cpu:0", "tiny-lm-wide")) and x.state == "loading", 20,
             what="tiny-lm-wide loading", log=w.log)
    res = celery.send_task(celery_app.INFER, args=["tiny-mlp"], queue=q).get(timeout=30)
    assert res["output"]["shape"] == [1, 10]
    assert not slow.ready(), "infer waited behind the preload"
    # Evicting it cancels the load: the preload fails as cancelled and nothing stays counted.
    ev = celery.send_task(celery_app.EVICT, args=["tiny-lm-wide"], queue=q).get(timeout=30)
    assert ev["versions"] == ["v1"] and ev["bytes_freed"] == 0
    with pytest.raises(Exception, match="evicted while loading"):
        slow.get(timeout=30)
    assert gpu(r, "node-a/cpu:0").used_bytes == size_of(catalog, "tiny-mlp")
    assert rep(r, "node-a/cpu:0", "tiny-lm-wide") is None


def test_sigkill_mid_load_leaves_the_fleet_and_a_restart_is_clean(r: redis.Redis, celery: Celery, catalog: Path,
                                                                 worker_factory) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    ttl = 2.0
    w = worker_factory(catalog, devices="cpu:0=64MiB", heartbeat_ttl=ttl,
                       env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(int(size / 60))})  # a load that won't finish
    g = state.read_fleet(r).gpu("node-a/cpu:0")
    d = Dispatcher(r, celery).preload("tiny-lm-wide", "v1", g, actor="operator", reason="test")
    assert d.sent
    wait_for(lambda: (x := rep(r, g.id, "tiny-lm-wide")) and x.state == "loading", 20, what="loading",
             log=w.log)
    assert gpu(r, g.id).used_bytes == size
    w.kill()
    killed_at = time.monotonic()
    wait_for(lambda: gpu_gone(w.redis_url, g.id), ttl + 5,
             what="the killed worker's GPU to leave the fleet")
    assert time.monotonic() - killed_at <= ttl + 5
    fleet = state.read_fleet(r)
    assert not fleet.gpu(g.id).alive and fleet.replicas() == []
    assert r.exists(keys.intent("tiny-lm-wide", g.id)), "the dead worker never confirmed its intent"

    w2 = worker_factory(catalog, devices="cpu:0=64MiB", heartbeat_ttl=ttl)
    fresh = gpu(r, g.id)
    assert fresh.alive and fresh.used_bytes == 0 and fresh.replicas == [] and str(w2.pid) in fresh.worker
    assert not r.exists(keys.intent("tiny-lm-wide", g.id)), "a starting worker clears stale claims"
    out = celery.send_task(celery_app.PRELOAD, args=["tiny-lm", "v1"], queue=g.queue).get(timeout=60)
    assert out["state"] == "ready" and gpu(r, g.id).used_bytes == out["bytes"]


def test_sigterm_takes_the_gpus_out_at_once(r: redis.Redis, catalog: Path, worker_factory) -> None:
    w = worker_factory(catalog, devices="cpu:0=64MiB,cpu:1=64MiB", heartbeat_ttl=30)
    assert w.stop() == 0
    assert all(gpu_gone(w.redis_url, gid) for gid in w.gpu_ids)  # not after a 30 s TTL: now
    assert not any(r.exists(keys.worker_lock(gid)) for gid in w.gpu_ids)


def _cli(redis_url: str, catalog: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update({"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PYTHONPATH": str(REPO)})
    return subprocess.run([sys.executable, "-m", "prewarm.programs.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO))


def test_operator_cli_against_a_real_worker(r: redis.Redis, redis_url: str, catalog: Path, worker_factory) -> None:
    w = worker_factory(catalog, devices="cpu:0=32MiB,cpu:1=64MiB")
    size = size_of(catalog, "tiny-lm-wide")

    p = _cli(redis_url, catalog, "preload", "tiny-lm-wide", "--wait", "--timeout", "60")
    assert p.returncode == 0, p.stderr
    assert "ready on node-a/cpu:0" in p.stdout  # the placement rule's tightest fit

    p = _cli(redis_url, catalog, "fleet", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    g0 = next(g for g in doc["gpus"] if g["id"] == "node-a/cpu:0")
    assert g0["used_bytes"] == size and g0["free_bytes"] == 32 * 2**20 - size and g0["total_bytes"] == 32 * 2**20
    (rp,) = g0["replicas"]
    assert rp["model"] == "tiny-lm-wide" and rp["state"] == "ready" and rp["bytes"] == size
    assert rp["load_seconds"] > 0 and rp["warmup_seconds"] > 0 and rp["error"] is None

    p = _cli(redis_url, catalog, "evict", "tiny-lm-wide", "--wait", "--timeout", "60")
    assert p.returncode == 0, p.stderr
    assert "evicted from node-a/cpu:0" in p.stdout
    assert gpu(r, "node-a/cpu:0").used_bytes == 0

    # A corrupted copy (valid file, shapes that no longer match the builder): a readable failure, and the
    # worker stays up and keeps serving.
    reshape_tensor(model_files(catalog, "tiny-lm-wide")[0], "tok.weight")
    p = _cli(redis_url, catalog, "preload", "tiny-lm-wide", "--gpu", "cpu:1", "--wait", "--timeout", "60")
    assert p.returncode != 0
    assert "failed" in p.stderr and "'tok.weight'" in p.stderr and "[1023, 128]" in p.stderr, p.stderr
    assert rep(r, "node-a/cpu:1", "tiny-lm-wide").state == "failed"
    assert gpu(r, "node-a/cpu:1").used_bytes == 0
    assert w.alive()
    p = _cli(redis_url, catalog, "preload", "tiny-mlp", "--gpu", "cpu:1", "--wait", "--timeout", "60")
    assert p.returncode == 0, p.stderr
    kinds = [e.kind for e in events.read(r, model="tiny-lm-wide", actor="worker")]
    assert "failed" in kinds and "ready" in kinds and "evicted" in kinds


def test_queued_preloads_do_not_take_the_threads_infer_needs(r: redis.Redis, celery: Celery, tmp_path: Path,
                                                             worker_factory) -> None:
    cat = tiny_catalog(tmp_path / "many", ["tiny-mlp", "tiny-lm", "tiny-lm@v2", "tiny-lm-wide", "tiny-sharded3"])
    # 3 threads, one load at a time per GPU, each load paced to a few seconds: without deferral, three
    # queued preloads would hold every thread and the infer below would wait behind them.
    w = worker_factory(cat, devices="cpu:0=64MiB", threads=3,
                       env={"PREWARM_LOAD_PACE_BYTES_PER_S": "50000", "PREWARM_MAX_LOADS_PER_GPU": "1"})
    q = w.queues["node-a/cpu:0"]
    celery.send_task(celery_app.PRELOAD, args=["tiny-mlp", "v1"], queue=q).get(timeout=60)
    pending = [celery.send_task(celery_app.PRELOAD, args=[m, v], queue=q)
               for m, v in (("tiny-lm", "v1"), ("tiny-lm", "v2"), ("tiny-sharded3", "v1"),
                            ("tiny-lm", "v1"))]
    wait_for(lambda: any(x.state == "loading" for x in gpu(r, "node-a/cpu:0").replicas), 20, what="a load",
             log=w.log)
    res = celery.send_task(celery_app.INFER, args=["tiny-mlp"], queue=q).get(timeout=20)
    assert res["output"]["shape"] == [1, 10]
    assert not any(p.ready() for p in pending), "infer waited behind the preloads"
    states = sorted(x.state for x in gpu(r, "node-a/cpu:0").replicas if x.model != "tiny-mlp")
    # One load at a time on this GPU; the others wait in the queue, shown pending.
    assert states in (["loading", "pending", "pending"], ["pending", "pending", "warming"]), states
    assert w.stop(timeout=60) == 0  # the load in progress is cancelled; the queued ones stay queued


def test_a_second_worker_for_the_same_gpus_is_refused(r: redis.Redis, redis_url: str, catalog: Path,
                                                     worker_factory, tmp_path: Path) -> None:
    first = worker_factory(catalog, devices="cpu:0=64MiB", heartbeat_ttl=2.0)
    second = procs.start_worker(redis_url, catalog, "cpu:0=64MiB", "node-a", heartbeat_ttl=2.0, wait=False,
                                log_dir=tmp_path / "second")
    try:
        assert second.proc.wait(timeout=60) == 1
    finally:
        second.kill()
    assert "served by another live worker" in second.log()
    g = gpu(r, "node-a/cpu:0")
    assert g.alive and str(first.pid) in g.worker  # the live owner's records are untouched
    time.sleep(2.5)  # past the TTL: the first worker is still the one heartbeating
    assert first.heartbeating()


def test_sigterm_mid_load_cancels_the_load_and_stops_cleanly(r: redis.Redis, celery: Celery, catalog: Path,
                                                             worker_factory) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    w = worker_factory(catalog, devices="cpu:0=64MiB", heartbeat_ttl=30,
                       env={"PREWARM_LOAD_PACE_BYTES_PER_S": str(int(size / 300))})  # a 5-minute load
    g = state.read_fleet(r).gpu("node-a/cpu:0")
    d = Dispatcher(r, celery).preload("tiny-lm-wide", "v1", g, actor="operator", reason="test")
    wait_for(lambda: (x := rep(r, g.id, "tiny-lm-wide")) and x.state == "loading", 20, what="loading", log=w.log)
    assert w.stop(timeout=60) == 0  # not after the 5-minute load
    with pytest.raises(Exception, match="cancelled: the worker is shutting down"):
        celery.AsyncResult(d.task_id).get(timeout=10)
    assert gpu_gone(w.redis_url, g.id)
    assert not r.exists(keys.intent("tiny-lm-wide", g.id)), "the scheduler may plan it again at once"


@pytest.mark.parametrize(("devices", "needle"), [
    ("gpu0", "'gpu0' is not a device"),
    ("cpu:0=1GiB,cpu:0=2GiB", "listed twice"),
])
def test_worker_refuses_bad_devices_clearly(redis_url: str, catalog: Path, tmp_path: Path, devices: str,
                                            needle: str) -> None:
    w = procs.start_worker(redis_url, catalog, devices, "node-bad", wait=False, log_dir=tmp_path)
    assert w.proc.wait(timeout=60) == 2
    assert needle in w.log() and "Traceback" not in w.log()
