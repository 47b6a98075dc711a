"""The ticks of `prewarm bench tick`, timed, and their figures."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from .fleet import GIB, BenchFleet, BenchWorker, Workload

HISTORY_S = 3600  # the traffic written before the first tick
HEARTBEAT_TTL_S = 120.0  # long enough that a slow tick never lets a GPU expire; refreshed before each tick
LOADS_PER_TICK = 2  # loads elsewhere in the fleet completing between ticks (their load times change)


def percentiles(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else [xs[0]] * 99
    return {"p50": round(q[49], 4), "p95": round(q[94], 4)}


@contextlib.contextmanager
def _redis_url() -> Iterator[str]:
    url = os.environ.get("PREWARM_REDIS_URL")
    if url:
        yield url
        return
    from prewarm.redis_server import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield server.url


GPU_MEMORY = 80 * GIB  # per GPU, unless --gpu-memory


def run_bench(models: int, gpus: int, ticks: int, *, gpu_memory: int = GPU_MEMORY, rate: float = 300.0,
              zipf: float = 1.1, interval: float | None = None, seed: int = 0, worker: bool = True,
              log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    if models < 1 or gpus < 1 or ticks < 2:
        raise ValueError("--models and --gpus must be at least 1 and --ticks at least 2 (the first tick is "
                         "reported apart from the p50/p95 of the others)")
    # (numpy's words for these named no option: "lam < 0 or lam contains NaNs", "expected non-negative integer")
    if gpu_memory < 1 or not 0 < rate < math.inf or not 0 <= zipf < math.inf or seed < 0 \
            or (interval is not None and not 0 <= interval < math.inf):
        raise ValueError("--gpu-memory and --rate must be above 0, --zipf, --interval and --seed 0 or more "
                         "(finite numbers)")
    from prewarm.config import Settings
    from prewarm.context import Context
    from scheduler.live import Scheduler

    with _redis_url() as url, tempfile.TemporaryDirectory(prefix="prewarm-bench-tick-") as tmp:
        r = redis.Redis.from_url(url)
        if r.dbsize():
            raise RuntimeError(f"the Redis database at PREWARM_REDIS_URL holds {r.dbsize()} keys: give the "
                               "benchmark an empty database (or unset PREWARM_REDIS_URL for an embedded one)")
        empty_bytes = int(r.info("memory")["used_memory"])
        t0 = time.perf_counter()
        w = Workload.make(models, rate, zipf, seed)
        catalog = w.write_catalog(Path(tmp) / "models")
        ctx = Context(Settings.from_env({**os.environ, "PREWARM_REDIS_URL": url, "PREWARM_CATALOG": str(catalog),
                                         "PREWARM_DATA_DIR": str(Path(tmp) / "var")}))
        t = time.perf_counter()
        n_catalog = len(ctx.catalog.ids())  # parsed once here, as a running scheduler has it before ticking
        catalog_s = time.perf_counter() - t
        now = time.time()
        fleet = BenchFleet.place(w, gpus, gpu_memory, now)
        fleet.record_loads(r)
        placed = fleet.count()
        end = int(now)
        requests = w.record(r, end - HISTORY_S, end, now)
        log(f"filled: {n_catalog} models, {gpus} GPUs with {placed} replicas, {requests} requests "
            f"in the last hour ({time.perf_counter() - t0:.1f} s; catalog parsed in {catalog_s:.2f} s)")
        sched = Scheduler(ctx, ident="bench")
        # The GPUs' workers, doing what the scheduler sends (see BenchWorker); None: nobody consumes.
        bw = BenchWorker(fleet, {m: int(x) for m, x in zip(w.ids, w.sizes, strict=True)}) if worker else None
        interval = ctx.settings.tick_seconds if interval is None else interval
        results = []
        redis_cpu_s: list[float] = []  # the Redis server's CPU seconds during each tick
        fed_until = end
        for k in range(ticks):
            started = time.time()
            if k:
                # Between ticks, as in a live fleet: new traffic, every GPU's heartbeat, loads completing.
                requests += w.record(r, fed_until, int(started), started)
                fed_until = int(started)
                fleet.loads_elsewhere(r, w, LOADS_PER_TICK, k)
                if bw is not None:
                    bw.step(r, started)
            fleet.heartbeat(r, HEARTBEAT_TTL_S)
            redis_cpu = _redis_cpu(r)
            res = sched.tick()
            redis_cpu_s.append(_redis_cpu(r) - redis_cpu)
            sched.heap.settle(sched.reader)  # as the scheduler's process does after each tick (settled_tick)
            if not res.leader:
                raise RuntimeError("the benchmark's scheduler did not get the leader lock: is another "
                                   "scheduler running against this Redis?")
            results.append(res)
            log(f"tick {k + 1}/{ticks}: {res.seconds * 1000:.0f} ms (snapshot {res.snapshot_seconds * 1000:.0f}, "
                f"plan {res.plan_seconds * 1000:.0f}, dispatch {res.dispatch_seconds * 1000:.0f}); "
                f"{res.actions} actions, {res.dispatched} dispatched, {res.round_trips} round trips")
            time.sleep(max(0.0, started + interval - time.time()))
        sched.leadership.release()
        first, steady = results[0], results[1:]
        out: dict[str, Any] = {
            "tick_seconds": percentiles([x.seconds for x in steady]),
            "snapshot_seconds": percentiles([x.snapshot_seconds for x in steady]),
            "plan_seconds": percentiles([x.plan_seconds for x in steady]),
            "dispatch_seconds": percentiles([x.dispatch_seconds for x in steady]),
            "first_tick_seconds": round(first.seconds, 4),
            "redis_bytes": int(r.info("memory")["used_memory"]) - empty_bytes,
            # Beyond the figures asked for: what the ticks did, and the first tick's parts.
            "first_tick": {"snapshot_seconds": round(first.snapshot_seconds, 4),
                           "plan_seconds": round(first.plan_seconds, 4),
                           "dispatch_seconds": round(first.dispatch_seconds, 4),
                           "actions": first.actions, "round_trips": first.round_trips},
            # CPU seconds of the scheduler's process per part (wall-clock parts include waiting for a core on
            # a shared machine; these do not), and of the Redis server during the tick.
            "cpu_seconds": {
                "snapshot": percentiles([x.snapshot_cpu_seconds for x in steady]),
                "plan": percentiles([x.plan_cpu_seconds for x in steady]),
                "dispatch": percentiles([x.dispatch_cpu_seconds for x in steady]),
                "redis": percentiles(redis_cpu_s[1:]),
                "first_tick": {"snapshot": round(first.snapshot_cpu_seconds, 4),
                               "plan": round(first.plan_cpu_seconds, 4),
                               "dispatch": round(first.dispatch_cpu_seconds, 4),
                               "redis": round(redis_cpu_s[0], 4)}},
            "round_trips": percentiles([float(x.round_trips) for x in steady]),
            "actions": percentiles([float(x.actions) for x in steady]),
            "dispatched": sum(x.dispatched for x in results),
            # Each tick's figures, in order: seconds, its parts, actions and round trips.
            "ticks": [{"seconds": round(x.seconds, 4), "snapshot_seconds": round(x.snapshot_seconds, 4),
                       "plan_seconds": round(x.plan_seconds, 4), "dispatch_seconds": round(x.dispatch_seconds, 4),
                       "actions": x.actions, "dispatched": x.dispatched, "round_trips": x.round_trips,
                       "cpu_seconds": round(x.snapshot_cpu_seconds + x.plan_cpu_seconds + x.dispatch_cpu_seconds, 4)}
                      for x in results],
            "settings": {"models": models, "gpus": gpus, "ticks": ticks, "gpu_memory": gpu_memory,
                         "rate": rate, "zipf": zipf, "interval": interval, "seed": seed,
                         "replicas": placed, "requests": requests, "catalog_seconds": round(catalog_s, 3),
                         "policy": _policy_build(), "worker": "acknowledging" if bw is not None else "none",
                         "tasks_done": bw.tasks if bw is not None else 0},
        }
        r.close()
        return out


def _redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _policy_build() -> str:
    from prewarm.domain.policy import native

    return "native" if native.active() else "pure"
