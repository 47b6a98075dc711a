"""The host-memory staging tier end to end, with real processes: Redis, a worker, web (gunicorn), a scheduler.

One worker serves one small CPU virtual GPU that holds either model but never both, and a host cache that
holds both. Traffic reported to /hooks/requests moves from A to B and back to A:

1. A's traffic gets A loaded (from storage);
2. B's traffic makes the scheduler evict A to make room for B, and stage A in the node's host cache
   (a scheduler "stage" event with its reason; the node's published host cache shows A staged, its bytes);
   B itself may be staged first, as a model likely soon with no GPU free while A is young: not relied on;
3. A's traffic again gets A loaded again, promoted from the host cache: the replica says source "host", the
   load time is kept in keys.promote_times(A) (not in keys.load_times(A)), the worker's "ready" event says
   from host, the scheduler's preload says it planned a promotion, and the staged copy counts a promotion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from prewarm import events, keys, state
from prewarm.catalog import parse_catalog
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.scheduler_procs import SchedulerProc
from tests.web_support import HookTraffic

pytestmark = pytest.mark.slow

A, B = "tiny-lm", "tiny-lm-wide"  # ~0.65 MiB and ~2.5 MiB of float32 weights
NODE, GPU = "node-a", "node-a/cpu:0"
DEVICE_BUDGET = 3 * 1024 * 1024  # either model fits alone, not both together
HOST_CACHE = "64MiB"  # both fit in host memory


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", [A, B])


@pytest.fixture
def traffic() -> Iterator[list[HookTraffic]]:
    started: list[HookTraffic] = []
    yield started
    for t in started:
        t.stop()


def replica(r: redis.Redis, model: str) -> state.Replica | None:
    g = state.read_fleet(r).gpu(GPU)
    return next((x for x in g.replicas if x.model == model), None) if g is not None else None


def ready(r: redis.Redis, model: str) -> state.Replica | None:
    x = replica(r, model)
    return x if x is not None and x.state == "ready" else None


def logged(r: redis.Redis, model: str, kind: str, actor: str, n: int = 1, *,
           log: Callable[[], str] | None = None) -> list[events.Event]:
    """Wait for at least `n` events of `kind` by `actor` about `model` (newest first). An event is written
    just after what it reports becomes visible (the scheduler records a dispatch after sending the task; the
    worker records "ready" after publishing the replica and its load time), so a test waits for it."""
    return wait_for(lambda: (evs := [e for e in events.read(r, model=model, kind=kind) if e.actor == actor])
                    and len(evs) >= n and evs, 15, what=f"{n} {kind} event(s) of {model} by {actor}", log=log)


def staged(r: redis.Redis, model: str) -> state.Staged | None:
    node = state.read_fleet(r).node(NODE)
    x = node.get(model) if node is not None else None
    return x if x is not None and x.state == "staged" else None


def test_evicted_model_is_staged_in_host_memory_and_promoted_back(redis_url, r, catalog, web, traffic, tmp_path,
                                                                   worker_factory) -> None:  # noqa: F811
    cat = parse_catalog(catalog.read_text(), catalog)
    size_a, size_b = cat.get(A).size_bytes, cat.get(B).size_bytes
    assert max(size_a, size_b) < DEVICE_BUDGET < size_a + size_b  # the scenario is forced: one at a time
    w = worker_factory(catalog, devices=f"cpu:0={DEVICE_BUDGET}", node=NODE, env={"PREWARM_HOST_CACHE": HOST_CACHE})
    sched = SchedulerProc(redis_url, catalog, tmp_path / "scheduler")
    try:
        logs = lambda: f"{w.log()[-3000:]}\n--- scheduler log (tail) ---\n{sched.log()[-3000:]}"  # noqa: E731
        wait_for(sched.is_leader, 30, what="scheduler leads", log=sched.log)
        node = wait_for(lambda: state.read_fleet(r).node(NODE), 15, what="the node's host cache announced", log=w.log)
        assert node.budget_bytes == 64 * 1024 * 1024 and node.staged == []

        # 1. Traffic for A: A is loaded from storage.
        traffic.append(HookTraffic(web.url, A))
        first = wait_for(lambda: ready(r, A), 60, what=f"{A} ready", log=logs)
        assert first.source == "storage"
        assert logged(r, A, "ready", "worker", log=logs)[0].numbers["source"] == "storage"
        assert r.llen(keys.load_times(A)) == 1 and r.llen(keys.promote_times(A)) == 0
        traffic.pop().stop()

        # 2. Traffic for B only: A is evicted to make room for B, and staged in the node's host cache.
        traffic.append(HookTraffic(web.url, B))
        wait_for(lambda: ready(r, B), 90, what=f"{B} ready (after {A} is evicted)", log=logs)
        wait_for(lambda: replica(r, A) is None, 15, what=f"{A} gone from {GPU}", log=logs)  # one at a time
        evicts = logged(r, A, "evict", "scheduler", log=logs)
        assert len(evicts) == 1 and evicts[0].gpu == GPU and f"make room on {GPU} for {B}" in evicts[0].reason, evicts
        copy = wait_for(lambda: staged(r, A), 60, what=f"{A} staged on {NODE}", log=logs)
        assert size_a <= copy.bytes < size_a + 64 * 64  # the data plus at most 63 bytes of alignment per tensor
        assert copy.version == cat.get(A).version and copy.promotions == 0
        stages = logged(r, A, "stage", "scheduler", log=logs)
        assert len(stages) == 1, stages
        stage = stages[0]
        assert stage.gpu == state.host_id(NODE) and stage.numbers.get("kind") == "demote"
        assert "evicted from its GPUs" in stage.reason and f"stage in {NODE}'s host cache" in stage.reason, stage
        assert stage.numbers["loss_per_s"] > 0 and {"promote_s", "load_s"} <= set(stage.numbers), stage
        done = logged(r, A, "staged", "worker", log=logs)
        assert len(done) == 1 and done[0].numbers["bytes"] == copy.bytes, done
        fleet = state.read_fleet(r)
        assert fleet.node(NODE).used_bytes >= copy.bytes
        traffic.pop().stop()

        # 3. Traffic for A again: A is loaded again, promoted from host memory rather than read from storage.
        traffic.append(HookTraffic(web.url, A))
        again = wait_for(lambda: ready(r, A), 90, what=f"{A} ready again (after {B} is evicted)", log=logs)
        assert again.source == "host", again
        assert again.created_at > first.created_at
        wait_for(lambda: replica(r, B) is None, 15, what=f"{B} gone from {GPU}", log=logs)
        readies = logged(r, A, "ready", "worker", 2, log=logs)  # written after the load time
        assert [e.numbers.get("source") for e in readies] == ["host", "storage"], readies
        assert r.llen(keys.promote_times(A)) == 1  # the promotion is measured apart from loads from storage
        assert r.llen(keys.load_times(A)) == 1
        preloads = logged(r, A, "preload", "scheduler", 2, log=logs)
        assert len(preloads) == 2, preloads
        assert preloads[0].numbers.get("from_host") == 1.0 and f"promoted from {NODE}'s host cache" in preloads[0].reason
        assert "from_host" not in preloads[1].numbers
        promoted = wait_for(lambda: (x := staged(r, A)) is not None and x.promotions >= 1 and x, 15,
                            what=f"the staged copy of {A} counts its promotion", log=logs)
        assert promoted.promotions == 1
        # No load failed on the way (a preload racing its make-room evict waits for it: gpu_worker/residency.py).
        assert not [e for e in events.read(r, limit=500) if e.kind == "failed"]
        print(f"{A}: loaded from storage in {r.lindex(keys.load_times(A), 0).decode()} s, "
              f"promoted from host in {r.lindex(keys.promote_times(A), 0).decode()} s (load + warmup)")
    except BaseException:
        # What happened, for a failure that is not a timeout (wait_for already attaches the logs to those).
        for e in reversed(events.read(r, limit=100)):
            print(f"{e.ts:.1f} {e.actor:9} {e.kind:8} {e.model:13} {e.gpu:14} {e.numbers.get('kind', '')} {e.reason}")
        print(logs())
        raise
    finally:
        for t in traffic:
            t.stop()
        traffic.clear()
        sched.stop()
