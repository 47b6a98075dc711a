"""One `bench live` run: per policy a fresh fleet and a live replay, then the simulator on the same work."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from prewarm.catalog import load_catalog
from prewarm.config import Settings
from prewarm.domain.policy import PolicyConfig
from prewarm.store import load_times
from simulator.engine import Simulation
from simulator.policies import POLICIES

from . import router, workload
from .fleet import Fleet

MIB = 1 << 20


def _waits(w: list[float]) -> dict:
    if not w:
        return {"p50": 0.0, "p95": 0.0}
    a = np.array(w, dtype=float)
    return {"p50": round(float(np.percentile(a, 50)), 3), "p95": round(float(np.percentile(a, 95)), 3)}


def _replay_loads(before: dict[str, load_times.Measured], after: dict[str, load_times.Measured]
                  ) -> dict[str, list[float]]:
    """model -> the worker's load + warmup seconds recorded during the replay. The lists are newest first and
    trimmed to KEPT, so the first len(after) - len(before) entries are the replay's (fewer than all of them
    when the list was trimmed, never an older one)."""
    return {m: a.load[:max(0, len(a.load) - len(before[m].load))] for m, a in after.items()}


MIN_REPLAY_LOADS = 3  # a model with fewer loads in the replay takes the fleet's median


def contention(alone: dict[str, list[float]], replay: dict[str, list[float]]) -> dict[str, float]:
    """model -> the seconds the worker's load took longer during the replay than measured one at a time before
    it (median minus median, at least 0): the CPU contention of the replay, which the simulator has no model of.
    A model with fewer than MIN_REPLAY_LOADS loads in the replay (or none measured alone) takes the median of
    the others' figures; 0 when no model has enough."""
    extra = {m: max(0.0, statistics.median(replay[m]) - statistics.median(alone[m])) for m in alone
             if alone[m] and len(replay.get(m, [])) >= MIN_REPLAY_LOADS}
    fleet = statistics.median(extra.values()) if extra else 0.0
    return {m: extra.get(m, fleet) for m in alone}


def run(trace: Path, minutes: float, speed: float, policies: list[str], *, n_models: int, rate: float, gpus: int,
        gpu_mib: int | None, seed: int, log: Callable[[str], None]) -> dict:
    wl = workload.build(trace, minutes, speed, n_models, rate, seed)
    data = Settings.from_env().data_dir
    catalog = workload.write_catalog(data / "bench-live-models", wl.models)
    sizes = [(workload.SIZES_MIB[i % len(workload.SIZES_MIB)]) for i in range(len(wl.models))]
    # the fleet holds about a third of the catalog: memory is short, so the eviction rule matters
    per_gpu = gpu_mib or max(max(sizes) + 8, sum(sizes) // (3 * gpus))
    devices = ",".join(f"cpu:{i}={per_gpu}MiB" for i in range(gpus))
    measured: dict[str, list[float]] = {m: [] for m in wl.models}  # the worker's load + warmup
    cold_path: dict[str, list[float]] = {m: [] for m in wl.models}  # cold lookup -> ready, as a router sees it
    live: dict[str, dict] = {}
    replay_worker: dict[str, dict[str, list[float]]] = {}  # policy -> model -> the worker's loads during its replay
    load1 = []
    log(f"bench live: {len(wl.times)} requests over {len(wl.models)} models, {minutes:g} trace minutes at "
        f"x{speed:g} ({wl.span_s:.0f} s a policy); {gpus} GPUs of {per_gpu} MiB")
    # The cold path when memory is full (the scheduler's make-room path), measured once on a fleet of its own
    # under on-demand-lru (whose make-room is plain: evict the least recently used), the same figure for
    # every policy: the replay's fleet holds a third of the catalog, so most of its cold loads take this path.
    make_room: dict[str, list[float]] = {m: [] for m in wl.models}
    fleet = Fleet(catalog, devices, "on-demand-lru", log)
    try:
        t0 = time.monotonic()
        fleet.start_web_and_worker(gpus)
        fleet.start_scheduler()
        for m, xs in fleet.measure_make_room(wl.models).items():
            make_room[m].extend(xs)
        log(f"  make-room cold path measured in {time.monotonic() - t0:.0f} s "
            f"({sum(map(len, make_room.values()))} lookups with no GPU room)")
    finally:
        fleet.stop()
    for name in policies:
        fleet = Fleet(catalog, devices, name, log)
        try:
            t0 = time.monotonic()
            fleet.start_web_and_worker(gpus)
            for m, xs in fleet.measure_loads(wl.models).items():
                cold_path[m].extend(xs)
            before = load_times.recent(fleet.r, wl.models)
            for m, x in before.items():
                measured[m].extend(x.load)
            fleet.start_scheduler()
            log(f"  {name}: fleet up and load times measured in {time.monotonic() - t0:.0f} s; replaying")
            res = router.replay(fleet.url, wl.models, wl.times, wl.mids)
            load1.append(os.getloadavg()[0])
            replay_worker[name] = _replay_loads(before, load_times.recent(fleet.r, wl.models))
            live[name] = res
            log(f"  {name}: {res['cold_starts']} cold starts live of {res['requests']} requests "
                f"({res['failed']} failed, the last cold waits drained {res['drain_s']} s after the last request was due)")
        finally:
            fleet.stop()
    worker_s = [statistics.median(measured[m]) if measured[m] else 1.0 for m in wl.models]
    # The simulator's load time: the cold path the router measured (the worker's own figure leaves out the
    # dispatch, the queue hop and the ready answer: the simulator given that misses most of a live wait),
    # with memory full where it was measured so (the wake, the scheduler's tick, the evict before the load),
    # else with free memory (the route hook's on-demand preload)
    free_s = [statistics.median(cold_path[m]) for m in wl.models]
    load_s = [statistics.median(make_room[m]) if make_room[m] else free_s[i] for i, m in enumerate(wl.models)]
    # ... with the worker's own load as it ran during that policy's replay in place of the load measured alone
    # (the replay's CPU contention: each policy loads the machine differently, and the live scheduler's measured
    # load times are the contended ones too). Added, not scaled: the rest of the path (dispatch, the hops) was
    # measured under its own conditions, and scaling it by the load's slowdown overshot (docs/simulation.md).
    extra = {name: contention(measured, replay_worker[name]) for name in policies}
    for name in policies:
        log(f"  {name}: the worker's loads took {statistics.median(extra[name].values()):.3f} s longer in the replay "
            "than measured alone (median over models); the simulator's cold path takes as much more, per model")
    contended = {name: [x + extra[name][m] for x, m in zip(load_s, wl.models, strict=True)] for name in policies}
    out: dict = {"policies": {}}
    sim_trace = wl.sim_trace(str(trace))
    cat = load_catalog(catalog)
    catalog_sizes = np.array([cat.get(m).size_bytes for m in wl.models])  # the bytes the worker holds
    def simulate(name: str, loads: list[float]) -> dict:
        sim = Simulation(sim_trace, catalog_sizes, np.array(loads), gpus, per_gpu * MIB,
                         load_slots=PolicyConfig().max_loads_per_gpu)
        sim.run(POLICIES[name]())
        return sim.results()

    worker_only, free_only, uncontended = {}, {}, {}
    for name in policies:
        s = simulate(name, contended[name])
        for into, loads in ((worker_only, worker_s), (free_only, free_s), (uncontended, load_s)):
            w = simulate(name, loads)
            into[name] = {"cold_starts": w["cold_starts"], "wait_seconds": {
                "p50": round(w["wait_seconds"]["p50"], 3), "p95": round(w["wait_seconds"]["p95"], 3)}}
        lv = live[name]
        out["policies"][name] = {
            "live": {"requests": lv["requests"], "cold_starts": lv["cold_starts"], "wait_seconds": _waits(lv["waits"])},
            "simulated": {"requests": s["requests"], "cold_starts": s["cold_starts"],
                          "wait_seconds": {"p50": round(s["wait_seconds"]["p50"], 3),
                                           "p95": round(s["wait_seconds"]["p95"], 3)}},
        }
    out["trace"] = {"source": str(trace), "minutes": minutes, "speed": speed, "models": len(wl.models),
                    "requests": int(len(wl.times)), "requests_before_thinning": wl.trace_requests,
                    "rate_per_s": rate, "seed": seed, "span_s": wl.span_s,
                    "mapping": dict(zip(wl.models, wl.functions, strict=True))}
    out["fleet"] = {"gpus": gpus, "gpu_bytes": per_gpu * MIB, "devices": devices,
                    "load_slots": PolicyConfig().max_loads_per_gpu, "tick_s": Settings.from_env().tick_seconds,
                    "model_bytes": {m: int(b) for m, b in zip(wl.models, catalog_sizes, strict=True)},
                    "load_seconds": {n: {m: round(x, 4) for m, x in zip(wl.models, c, strict=True)}
                                     for n, c in contended.items()},
                    "worker_load_seconds": {m: round(x, 4) for m, x in zip(wl.models, worker_s, strict=True)},
                    "simulated_with_worker_load_seconds": worker_only,
                    "free_memory_load_seconds": {m: round(x, 4) for m, x in zip(wl.models, free_s, strict=True)},
                    "make_room_load_seconds": {m: [round(x, 4) for x in make_room[m]] for m in wl.models},
                    "simulated_with_free_memory_load_seconds": free_only,
                    "uncontended_load_seconds": {m: round(x, 4) for m, x in zip(wl.models, load_s, strict=True)},
                    "simulated_uncontended": uncontended,
                    "replay_worker_load_seconds": {n: {m: [round(x, 4) for x in xs] for m, xs in rw.items()}
                                                   for n, rw in replay_worker.items()},
                    "contention_seconds": {n: {m: round(x, 4) for m, x in e.items()} for n, e in extra.items()},
                    "load_average_1m": [round(x, 2) for x in load1],
                    "failed": {n: live[n]["failed"] for n in policies},
                    "errors": {n: live[n]["errors"] for n in policies if live[n]["errors"]}}
    return out
