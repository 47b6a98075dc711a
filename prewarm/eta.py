"""When a model will be ready: the seconds the route hook promises a router for a loading or cold model.

From the worker's measured load+warmup seconds (the median of the model's last KEPT loads, or the
policy's size-based default when never measured; a promotion from the node's host cache where it is
staged there), each replica's progress so far, and its place in its GPU's load queue: the GPU runs
`max_loads` loads at once (PREWARM_MAX_LOADS_PER_GPU) and starts the waiting ones in order as a slot
frees, so a queued load's ETA is when a slot frees for it plus its own load time.

The figures come from `read_inputs` (Redis, a few pipelined reads) and `queue_etas` is pure.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from prewarm import priority as priorities
from prewarm import state
from prewarm.catalog_entries import Catalog
from prewarm.domain import states as rs
from prewarm.domain.policy.types import GIB, PolicyConfig
from prewarm.store import load_times

_DEFAULTS = PolicyConfig()  # the size-based defaults the scheduler plans with for unmeasured models
# Below this progress a load's own speed is not yet a measure: the expected time stands instead.
_MIN_PROGRESS = 0.05


@dataclass(frozen=True)
class Measured:
    load: dict[str, float]  # model -> median load+warmup seconds from storage
    promote: dict[str, float]  # model -> median promotion+warmup seconds from a host cache


def expected_seconds(catalog: Catalog, measured: Measured, model: str, version: str, staged: bool) -> float:
    """Load+warmup seconds of one load of model@version (from the host cache when `staged`)."""
    try:
        size = catalog.get(model, version).size_bytes
    except KeyError:
        size = 0
    if staged:
        return measured.promote.get(model) or _DEFAULTS.default_promote_seconds(size)
    return measured.load.get(model) or _DEFAULTS.default_load_seconds(size)


def _warmup_seconds(catalog: Catalog, model: str, version: str, total: float) -> float:
    try:
        size = catalog.get(model, version).size_bytes
    except KeyError:
        return 0.0
    return min(total, _DEFAULTS.warmup_s_per_gib * size / GIB)


def remaining_seconds(rep: state.Replica, expected: float, warmup: float, now: float) -> float:
    """Seconds left of a load holding a slot: at its own pace so far once it has made some progress (a
    slower disk than usual shows at once), else the expected time less what has passed."""
    elapsed = max(0.0, now - rep.since)
    if rep.state == rs.WARMING:
        return max(0.0, warmup - elapsed)
    if rep.progress >= _MIN_PROGRESS and elapsed > 0:
        return elapsed * (1.0 - rep.progress) / rep.progress + warmup
    return max(expected - elapsed, warmup)


@dataclass(frozen=True)
class Waiting:
    """A load waiting for one of its GPU's slots: a `pending` replica, or a preload dispatched but not yet
    seen by the worker (which queues it behind those it has)."""

    model: str
    version: str
    order: tuple[int, int, float]  # the worker starts waiting loads highest priority first, then first come,
    #   first served: (0, -priority rank, queued at) for its pending replicas, (1, -normal, dispatched at) for
    #   preloads it has not seen yet (an intent does not say its priority)
    expected: float


def queue_etas(active: Iterable[float], waiting: list[Waiting], max_loads: int) -> dict[tuple[str, str], float]:
    """(model, version) -> seconds until that waiting load is ready, given the seconds left of the loads
    holding slots now (`active`) and the waiting loads in any order; max_loads <= 0: no limit."""
    busy = sorted(active)
    slots = max(max_loads, 1) if max_loads > 0 else len(busy) + len(waiting) + 1
    free_at = busy[:slots] + [0.0] * max(0, slots - len(busy))
    # a load past the slot count (none should be) finishes before a slot frees for the waiting ones
    for extra in busy[slots:]:
        free_at[free_at.index(min(free_at))] = max(min(free_at), extra)
    heapq.heapify(free_at)
    out: dict[tuple[str, str], float] = {}
    for w in sorted(waiting, key=lambda w: w.order):
        done = heapq.heappop(free_at) + w.expected
        heapq.heappush(free_at, done)
        out.setdefault((w.model, w.version), done)
    return out


def read_measured(r: redis.Redis, models: Iterable[str]) -> Measured:
    load, promote = load_times.medians(r, sorted(set(models)))
    return Measured(load, promote)


def gpu_etas(catalog: Catalog, fleet: state.Fleet, gpu: state.Gpu, intents: list[state.Intent],
             measured: Measured, max_loads: int, now: float) -> dict[tuple[str, str], float]:
    """(model, version) -> seconds until ready of every load on `gpu`: those holding a slot and those
    waiting (pending replicas, then preloads dispatched there and not yet visible)."""
    staged_here = {(x.model, x.version) for x in fleet.staged() if x.node == gpu.node}
    out: dict[tuple[str, str], float] = {}
    active: list[float] = []
    waiting: list[Waiting] = []
    seen = set()
    for rep in gpu.replicas:
        key = (rep.model, rep.version)
        if rep.state in rs.HOLDING:
            seen.add(key)  # a preload intent of it is this replica, not another load
        if rep.state not in rs.IN_FLIGHT:
            continue
        exp = expected_seconds(catalog, measured, rep.model, rep.version, key in staged_here)
        if rep.state == rs.PENDING:
            waiting.append(Waiting(rep.model, rep.version, (0, -priorities.rank(rep.priority), rep.created_at or rep.since),
                                   exp))
            continue
        left = remaining_seconds(rep, exp, _warmup_seconds(catalog, rep.model, rep.version, exp), now)
        active.append(left)
        out[key] = left
    for it in intents:
        key = (it.model, it.version)
        if it.action == "preload" and it.gpu == gpu.id and key not in seen:
            exp = expected_seconds(catalog, measured, it.model, it.version, key in staged_here)
            waiting.append(Waiting(it.model, it.version, (1, -priorities.rank(None), it.created_at), exp))
    out.update(queue_etas(active, waiting, max_loads))
    return out


def model_eta(r: redis.Redis, catalog: Catalog, fleet: state.Fleet, model: str, version: str,
              max_loads: int, now: float, unplaced_wait_s: float) -> float:
    """Seconds until the first replica of model@version is ready on the live fleet: the soonest of its loads
    in flight or queued anywhere; with none (no room yet: the scheduler makes room first), its load time
    plus `unplaced_wait_s`."""
    intents = [it for it in state.read_intents(r) if it.action == "preload"]
    gpus = [g for g in fleet.alive()
            if any(x.model == model and x.version == version and x.state in rs.IN_FLIGHT
                   for x in g.replicas)
            or any(it.gpu == g.id and it.model == model and it.version == version for it in intents)]
    names = {x.model for g in gpus for x in g.replicas} | {it.model for it in intents if it.gpu in
                                                           {g.id for g in gpus}} | {model}
    measured = read_measured(r, names)
    best = math.inf
    for g in gpus:
        etas = gpu_etas(catalog, fleet, g, intents, measured, max_loads, now)
        best = min(best, etas.get((model, version), math.inf))
    if math.isinf(best):
        staged = any(x.version == version for x in fleet.staged(model))
        best = expected_seconds(catalog, measured, model, version, staged) + unplaced_wait_s
    return best


def retry_after(eta: float) -> str:
    """The Retry-After header for an ETA: whole seconds, at least 1."""
    return str(max(1, math.ceil(eta)))
