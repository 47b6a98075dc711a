"""The host-memory staging tier on the worker: stage / promote / unstage, in-process and through a real worker.

Real Redis, real safetensors files of tiny real models, real torch modules; no timing asserts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from gpu_worker.errors import Busy, Cancelled, DoesNotFit, LoadFailed, UnknownModel
from gpu_worker.residency import NodeWorker, WorkerOptions
from prewarm import celery_app, events, keys, state
from prewarm.config import parse_devices
from prewarm.dispatch import Dispatcher
from tests import procs
from tests.model_files import (
    corrupt_header,
    model_files,
    offsets_past_eof,
    reshape_tensor,
    tiny_catalog,
    truncate,
)
from tests.procs import REPO, wait_for
from tests.system.test_worker_residency import make_worker, size_of

worker_factory = procs.worker_factory  # the fixture, used by name

MODELS = ["tiny-lm", "tiny-sharded", "tiny-mlp", "tiny-lm-wide"]
MiB = 2**20


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", MODELS)


def node(r: redis.Redis, name: str = "node-t") -> state.Node:
    n = state.read_fleet(r).node(name)
    assert n is not None, f"node {name} publishes no host cache"
    return n


def claim(r: redis.Redis, action: str, model: str, target: str) -> None:
    now = time.time()
    assert state.claim_intent(r, state.Intent(action, model, "v1", target, "operator", "test", now, now + 60))


def test_stage_promote_evict_unstage(r: redis.Redis, catalog: Path) -> None:
    w = make_worker(r, catalog, host_cache_bytes=16 * MiB)
    g0, g1 = w.gpu_for("cpu:0"), w.gpu_for("cpu:1")
    size = size_of(catalog, "tiny-sharded")
    host = state.host_id("node-t")
    # A copy read from storage, before anything is staged: the reference output.
    assert w.preload(g1, "tiny-sharded")["source"] == "storage"
    reference = w.infer(g1, "tiny-sharded", [[1, 2, 3, 4]])["output"]

    claim(r, "stage", "tiny-sharded", host)
    out = w.stage("tiny-sharded", reason="test stage", kind="operator", value=2.0)
    assert out["state"] == "staged" and not out["noop"] and out["node"] == "node-t"
    assert size <= out["bytes"] < size + 64 * 100  # the data plus the arena's per-tensor alignment
    assert out["host_cache"] == {"budget_bytes": 16 * MiB, "used_bytes": out["bytes"],
                                 "free_bytes": 16 * MiB - out["bytes"]}
    assert not r.exists(keys.intent("tiny-sharded", host)), "the intent is released once staged"
    n = node(r)
    assert (n.budget_bytes, n.used_bytes, n.free_bytes) == (16 * MiB, out["bytes"], 16 * MiB - out["bytes"])
    (x,) = state.read_staged(r)["node-t"]
    assert (x.model, x.version, x.state, x.bytes, x.value, x.reason) == ("tiny-sharded", "v1", "staged",
                                                                          out["bytes"], 2.0, "test stage")
    assert 0 < r.pttl(keys.staged("node-t")) <= 30_000 and 0 < r.pttl(keys.host_cache("node-t")) <= 30_000
    ev = events.read(r, kind="staged", model="tiny-sharded")[0]
    assert ev.actor == "worker" and ev.gpu == host and ev.numbers["bytes"] == out["bytes"]
    # No device memory is used by staging.
    assert state.read_fleet(r).gpu(g0.id).used_bytes == 0

    again = w.stage("tiny-sharded", value=1.0)  # idempotent; keeps the larger keep-value
    assert again["noop"] and again["bytes"] == out["bytes"] and again["value"] == 2.0
    assert len(events.read(r, kind="staged", model="tiny-sharded")) == 1

    p = w.preload(g0, "tiny-sharded")
    assert p["source"] == "host" and p["bytes"] == size and p["load_seconds"] > 0
    rep = next(x for x in state.read_fleet(r).gpu(g0.id).replicas if x.model == "tiny-sharded")
    assert rep.state == "ready" and rep.source == "host" and rep.bytes == size
    assert events.read(r, kind="ready", model="tiny-sharded")[0].numbers["source"] == "host"
    assert state.read_fleet(r).gpu(g0.id).used_bytes == size  # device accounting as for a storage load
    assert w.infer(g0, "tiny-sharded", [[1, 2, 3, 4]])["output"] == reference  # the same weights
    assert node(r).get("tiny-sharded").promotions == 1
    # Promotions are timed apart from loads from storage (the scheduler's cold-load horizon).
    assert len(r.lrange(keys.load_times("tiny-sharded"), 0, -1)) == 1  # the storage load on cpu:1
    assert len(r.lrange(keys.promote_times("tiny-sharded"), 0, -1)) == 1

    # Evicting the device replica keeps the staged copy.
    assert w.evict(g0, "tiny-sharded")["bytes_freed"] == size
    assert node(r).get("tiny-sharded").state == "staged" and node(r).used_bytes == out["bytes"]

    claim(r, "unstage", "tiny-sharded", host)
    un = w.unstage("tiny-sharded", reason="test unstage")
    assert un == {"model": "tiny-sharded", "node": "node-t", "versions": ["v1"], "bytes_freed": out["bytes"],
                  "noop": False, "host_cache": {"budget_bytes": 16 * MiB, "used_bytes": 0, "free_bytes": 16 * MiB}}
    assert not r.exists(keys.intent("tiny-sharded", host))
    assert node(r).staged == [] and node(r).used_bytes == 0
    assert events.read(r, kind="unstaged", model="tiny-sharded")[0].numbers["bytes_freed"] == out["bytes"]
    assert w.unstage("tiny-sharded")["noop"]  # idempotent
    # The device replica on the other GPU never depended on the staged copy; a new preload reads storage.
    assert w.infer(g1, "tiny-sharded", [[1, 2, 3, 4]])["output"] == reference
    assert w.preload(g0, "tiny-sharded")["source"] == "storage"


@pytest.mark.parametrize("damage", ["truncate", "corrupt_header", "offsets_past_eof", "reshape"])
def test_stage_of_a_broken_file_fails_readably_and_stages_nothing(r: redis.Redis, catalog: Path,
                                                                  damage: str) -> None:
    w = make_worker(r, catalog, host_cache_bytes=16 * MiB)
    host = state.host_id("node-t")
    w.stage("tiny-mlp")
    f = model_files(catalog, "tiny-lm-wide")[0]
    {"truncate": truncate, "corrupt_header": corrupt_header, "offsets_past_eof": offsets_past_eof,
     "reshape": lambda p: reshape_tensor(p, "tok.weight")}[damage](f)
    claim(r, "stage", "tiny-lm-wide", host)
    with pytest.raises(LoadFailed) as err:
        w.stage("tiny-lm-wide")
    msg = str(err.value)
    assert "staging tiny-lm-wide@v1 on node node-t" in msg
    assert (f.name in msg) or ("'tok.weight'" in msg), msg
    # Nothing half-staged: only the earlier model is there, and the accounting is back where it was.
    assert [e.key for e in w.host_cache.entries()] == ["tiny-mlp@v1"]
    mlp = w.host_cache.get("tiny-mlp@v1").nbytes
    assert w.host_cache.used_bytes == mlp
    n = node(r)
    assert [x.model for x in n.staged] == ["tiny-mlp"] and n.used_bytes == mlp
    assert not r.exists(keys.intent("tiny-lm-wide", host)), "the scheduler may plan it again"
    failed = events.read(r, kind="failed", model="tiny-lm-wide")[0]
    assert failed.gpu == host and failed.reason == msg
    # The worker keeps staging and serving.
    assert not w.stage("tiny-lm")["noop"]
    assert w.preload(w.gpu_for("cpu:0"), "tiny-mlp")["source"] == "host"


def test_stage_refuses_what_the_budget_cannot_hold_and_evicts_by_value_per_byte(r: redis.Redis,
                                                                                  catalog: Path) -> None:
    budget = 4 * MiB + MiB // 2
    w = make_worker(r, catalog, host_cache_bytes=budget)
    wide = w.stage("tiny-lm-wide", value=1.0)["bytes"]  # ~2.7 MB, 1 per 2.7 MB
    lm = w.stage("tiny-lm", value=10.0)["bytes"]  # ~0.7 MB, worth much more per byte
    assert node(r).used_bytes == wide + lm

    # ~3.5 MB worth less per byte than either: room would need more valuable bytes.
    with pytest.raises(DoesNotFit, match="host cache|value/byte"):
        w.stage("tiny-sharded", value=0.5)
    assert sorted(e.key for e in w.host_cache.entries()) == ["tiny-lm-wide@v1", "tiny-lm@v1"]
    assert node(r).used_bytes == wide + lm and all(x.state == "staged" for x in node(r).staged)

    # Worth more per byte than tiny-lm-wide (not than tiny-lm): that one, and only that one, makes room.
    out = w.stage("tiny-sharded", value=10.0)
    assert out["evicted"] == ["tiny-lm-wide@v1"]
    assert sorted(x.model for x in node(r).staged) == ["tiny-lm", "tiny-sharded"]
    assert node(r).used_bytes == lm + out["bytes"] <= budget
    ev = events.read(r, kind="unstaged", model="tiny-lm-wide")[0]
    assert "value-per-byte" in ev.reason and "tiny-sharded@v1" in ev.reason

    # Bigger than the whole budget: refused with the knob to turn.
    small = NodeWorker(r, catalog, "node-small", parse_devices("cpu:0=16MiB"), WorkerOptions(host_cache_bytes=MiB))
    with pytest.raises(DoesNotFit, match="PREWARM_HOST_CACHE"):
        small.stage("tiny-sharded", value=100.0)
    with pytest.raises(UnknownModel):
        w.stage("no-such-model")


def test_unstage_cancels_a_stage_in_progress(r: redis.Redis, catalog: Path) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    w = make_worker(r, catalog, host_cache_bytes=16 * MiB, load_pace_bytes_per_s=size / 120)  # a 2-minute stage
    outcome: list[BaseException | dict] = []

    def run() -> None:
        try:
            outcome.append(w.stage("tiny-lm-wide"))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    t = threading.Thread(target=run)
    t.start()
    staging = wait_for(lambda: next((x for x in node(r).staged if x.state == "staging"), None), 20,
                       what="the stage to show")
    assert staging.model == "tiny-lm-wide" and staging.total_bytes == size
    # The stage's reservation counts while it runs (made as its read starts, just after the record shows).
    wait_for(lambda: node(r).used_bytes > 0 and t.is_alive(), 20, what="the stage's reservation to be published")
    un = w.unstage("tiny-lm-wide", reason="changed my mind")
    t.join(30)
    assert not t.is_alive()
    assert isinstance(outcome[0], Cancelled) and "changed my mind" in str(outcome[0])
    assert not un["noop"] and un["bytes_freed"] == 0  # nothing had been staged yet
    assert len(w.host_cache) == 0 and w.host_cache.used_bytes == 0
    assert node(r).staged == [] and node(r).used_bytes == 0


def test_a_preload_waits_for_a_stage_of_its_model_then_promotes_it(r: redis.Redis, catalog: Path) -> None:
    size = size_of(catalog, "tiny-lm-wide")
    w = make_worker(r, catalog, host_cache_bytes=16 * MiB, load_pace_bytes_per_s=size / 2)  # a 2-second stage
    g = w.gpu_for("cpu:0")
    t = threading.Thread(target=w.stage, args=("tiny-lm-wide",))
    t.start()
    wait_for(lambda: any(x.state == "staging" for x in node(r).staged), 20, what="the stage to show")
    # As the Celery task runs it (defer): back to the queue, shown pending, no second read from storage.
    with pytest.raises(Busy, match="being staged on node node-t"):
        w.preload(g, "tiny-lm-wide", defer=True, task_id="t1")
    rep = next(x for x in state.read_fleet(r).gpu(g.id).replicas if x.model == "tiny-lm-wide")
    assert rep.state == "pending" and rep.bytes == 0
    t.join(60)
    assert node(r).get("tiny-lm-wide").state == "staged"
    out = w.preload(g, "tiny-lm-wide", defer=True, task_id="t1")  # the retry
    assert out["source"] == "host" and out["bytes"] == size


def test_a_staged_copy_older_than_its_files_is_not_promoted(r: redis.Redis, catalog: Path) -> None:
    w = make_worker(r, catalog, host_cache_bytes=16 * MiB)
    g = w.gpu_for("cpu:0")
    w.stage("tiny-mlp")
    f = model_files(catalog, "tiny-mlp")[0]
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file was replaced since it was staged
    assert w.preload(g, "tiny-mlp")["source"] == "storage"
    assert node(r).staged == [] and len(w.host_cache) == 0
    assert "changed since staged" in events.read(r, kind="unstaged", model="tiny-mlp")[0].reason
    w.evict(g, "tiny-mlp")
    assert not w.stage("tiny-mlp")["noop"]
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    assert not w.stage("tiny-mlp")["noop"], "a re-stage replaces a stale copy"
    assert w.preload(g, "tiny-mlp")["source"] == "host"


def test_a_worker_publishes_its_host_cache_and_takes_it_along_when_it_stops(r: redis.Redis,
                                                                           catalog: Path) -> None:
    w: NodeWorker = make_worker(r, catalog, host_cache_bytes=8 * MiB)
    w.stage("tiny-mlp")
    r.delete(keys.staged("node-t"), keys.host_cache("node-t"))  # as if the keys had expired
    w.heartbeat()  # the heartbeat rewrites them in full
    assert [x.model for x in node(r).staged] == ["tiny-mlp"]
    w.shutdown()
    assert state.read_fleet(r).node("node-t") is None and state.read_staged(r) == {}


# --- through a real worker process ------------------------------------------------------------------------


@pytest.fixture
def celery(redis_url: str) -> Iterator[Celery]:
    app = celery_app.make_celery(redis_url)
    yield app
    app.close()


def _cli(redis_url: str, catalog: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update({"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PYTHONPATH": str(REPO)})
    return subprocess.run([sys.executable, "-m", "prewarm.programs.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO))


def test_staging_through_celery_and_the_cli(r: redis.Redis, redis_url: str, celery: Celery, catalog: Path,
                                            worker_factory: Callable[..., procs.WorkerProc]) -> None:
    w = worker_factory(catalog, devices="cpu:0=64MiB,cpu:1=64MiB", env={"PREWARM_HOST_CACHE": "8MiB"})
    wait_for(lambda: state.read_fleet(r).node("node-a"), 10, what="the host cache to be announced", log=w.log)
    fleet = state.read_fleet(r)
    g1 = fleet.gpu("node-a/cpu:1")
    size = size_of(catalog, "tiny-sharded")

    d = Dispatcher(r, celery).stage("tiny-sharded", "v1", g1, actor="scheduler", reason="likely soon",
                                    kind="speculative", value=3.0)
    assert d.sent and d.gpu == "node-a/host"
    again = Dispatcher(r, celery).stage("tiny-sharded", "v1", g1, actor="scheduler", reason="twice")
    assert not again.sent, "one stage per (model, node) in flight"
    out = celery.AsyncResult(d.task_id).get(timeout=60)
    assert out["state"] == "staged" and out["node"] == "node-a" and out["bytes"] >= size
    assert not r.exists(keys.intent("tiny-sharded", "node-a/host"))
    assert int(r.hget(keys.DISPATCH_COUNTS, "stage:speculative")) == 1
    assert [e.kind for e in events.read(r, model="tiny-sharded")][:2] == ["staged", "stage"]

    p = _cli(redis_url, catalog, "fleet", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert sorted(doc) == ["gpus", "nodes"] and {g["id"] for g in doc["gpus"]} == {"node-a/cpu:0", "node-a/cpu:1"}
    (n,) = doc["nodes"]
    assert n["node"] == "node-a"
    assert n["host_cache"]["budget_bytes"] == 8 * MiB and n["host_cache"]["used_bytes"] == out["bytes"]
    assert n["host_cache"]["free_bytes"] == 8 * MiB - out["bytes"]
    assert [(x["model"], x["state"], x["bytes"]) for x in n["staged"]] == [("tiny-sharded", "staged", out["bytes"])]
    assert all(g["used_bytes"] == 0 for g in doc["gpus"]), "staging holds no device memory"

    # A preload through the one dispatch path promotes the staged copy (to the other GPU: the cache is the node's).
    g0 = fleet.gpu("node-a/cpu:0")
    d = Dispatcher(r, celery).preload("tiny-sharded", "v1", g0, actor="scheduler", reason="imminent")
    res = celery.AsyncResult(d.task_id).get(timeout=60)
    assert res["source"] == "host" and res["bytes"] == size and res["load_seconds"] > 0
    inf = celery.send_task(celery_app.INFER, args=["tiny-sharded"], kwargs={"inputs": [[5, 6, 7]]},
                           queue=g0.queue).get(timeout=30)
    assert inf["output"]["shape"] == [1, 3, 1024] and inf["output"]["finite"]

    p = _cli(redis_url, catalog, "evict", "tiny-sharded", "--wait", "--timeout", "60")
    assert p.returncode == 0, p.stderr
    assert state.read_fleet(r).node("node-a").get("tiny-sharded").state == "staged", "evict keeps the staged copy"

    p = _cli(redis_url, catalog, "fleet")
    assert p.returncode == 0 and "node-a host cache" in p.stdout and "tiny-sharded@v1" in p.stdout, p.stdout

    p = _cli(redis_url, catalog, "unstage", "tiny-sharded", "--wait", "--timeout", "60")
    assert p.returncode == 0, p.stderr
    assert "unstaged from node-a" in p.stdout
    n2 = state.read_fleet(r).node("node-a")
    assert n2.staged == [] and n2.used_bytes == 0
    p = _cli(redis_url, catalog, "unstage", "tiny-sharded")
    assert p.returncode == 0 and "nothing to unstage" in p.stdout

    p = _cli(redis_url, catalog, "stage", "tiny-lm", "--node", "node-a", "--wait", "--timeout", "60")
    assert p.returncode == 0, p.stderr
    assert "tiny-lm@v1 staged on node-a" in p.stdout

    # A broken file: a readable failure, nothing staged, and the worker stays up.
    reshape_tensor(model_files(catalog, "tiny-lm-wide")[0], "tok.weight")
    p = _cli(redis_url, catalog, "stage", "tiny-lm-wide", "--wait", "--timeout", "60")
    assert p.returncode != 0
    assert "stage of tiny-lm-wide@v1 on node-a failed" in p.stderr and "'tok.weight'" in p.stderr, p.stderr
    assert [x.model for x in state.read_fleet(r).node("node-a").staged] == ["tiny-lm"]
    assert w.alive()

    w.stop()
    assert state.read_fleet(r).node("node-a") is None, "a stopped worker takes its host cache out at once"

