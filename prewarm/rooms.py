"""Room on the live fleet for one more load: each GPU's free bytes less what preloads already sent will
take, its loads in flight or queued, and the nodes holding the model staged, read from the fleet and
the intents in Redis. These are the inputs of the one placement rule (prewarm.domain.policy.placement.rank);
the route hook's on-demand preload, the operator CLI and the API all choose through `ranked`, among the
GPUs that take loads (state.Fleet.placeable: alive, heartbeat fresh, node not draining)."""

from __future__ import annotations

import time

import redis

from prewarm import state
from prewarm.catalog_entries import Catalog, ModelEntry
from prewarm.domain import states as rs
from prewarm.domain.policy.placement import Room, rank, roomiest
from prewarm.units import format_bytes


def read_rooms(r: redis.Redis, fleet: state.Fleet, catalog: Catalog) -> list[Room]:
    """Per GPU that takes loads (fleet.placeable): measured free bytes less the bytes promised to preloads
    dispatched but not yet visible as replicas (free bytes do not show them yet: counting them keeps two
    preloads from being sent into one gap), and its loads in flight or queued, those preloads included."""
    placeable = fleet.placeable()
    pending = dict.fromkeys((g.id for g in placeable), 0)
    loads = {g.id: sum(1 for x in g.replicas if x.state in rs.IN_FLIGHT) for g in placeable}
    for it in state.read_intents(r):
        g = fleet.gpu(it.gpu)
        if it.action != "preload" or g is None or g.id not in loads:
            continue
        seen = [x for x in g.replicas if x.model == it.model and x.version == it.version]
        if seen and seen[0].state != rs.PENDING:
            continue  # already a replica: its bytes are in free_bytes and its load is counted
        if not seen:
            loads[g.id] += 1
        # (a `pending` placeholder queued for a load slot owns no memory yet: its bytes stay promised)
        try:
            pending[g.id] += catalog.get(it.model, it.version).size_bytes
        except KeyError:
            continue
    return [Room(g.id, g.node, g.free_bytes - pending[g.id], loads[g.id]) for g in placeable]


def staged_nodes(fleet: state.Fleet, entry: ModelEntry) -> set[str]:
    """Nodes whose host cache holds this version ready to promote."""
    return {x.node for x in fleet.staged(entry.id) if x.version == entry.version}


def ranked(r: redis.Redis, fleet: state.Fleet, catalog: Catalog, entry: ModelEntry,
           max_loads: int, idle_link: bool = False) -> list[state.Gpu]:
    """The GPUs that take loads (fleet.placeable) and have room for `entry` now, best first by the placement
    rule; a GPU that already holds this version (loading, ready or evicting it) is not one. `idle_link`: only
    GPUs with no load in flight or queued (whether to share a busy link or wait for it is the scheduler's:
    PolicyConfig.link_wait)."""
    busy = {g.id for g in fleet.alive() for x in g.replicas
            if x.model == entry.id and x.version == entry.version and x.state in rs.HOLDING}
    rooms = [x for x in read_rooms(r, fleet, catalog) if not (idle_link and x.loads)]
    order = rank(rooms, entry.size_bytes, staged_nodes(fleet, entry), busy, max_loads)
    gpus = {g.id: g for g in fleet.placeable()}
    return [gpus[x.gpu] for x in order]


def late_note(fleet: state.Fleet, now: float | None = None) -> str:
    """Why live GPUs were passed over, for a placement's message: "" when none was (see Fleet.placeable)."""
    now = time.time() if now is None else now
    late = [state.late_reason(g, now) for g in fleet.alive() if not g.fresh]
    draining = [g.id for g in fleet.alive() if g.draining]
    notes = ([f"heartbeat late: {'; '.join(late)}"] if late else []) + \
        ([f"node draining: {', '.join(draining)}"] if draining else [])
    return f" (passed over, {'; '.join(notes)})" if notes else ""


def pick_gpu(r: redis.Redis, fleet: state.Fleet, catalog: Catalog, entry: ModelEntry, gpu: str | None,
             max_loads: int) -> state.Gpu:
    """The operator's target: the GPU named (id or device), else the placement rule's first; when no
    GPU has room, placement.roomiest's (the worker makes room there or refuses, saying why). A GPU whose
    heartbeat is late, or whose node is draining, is never the target, named or not (Fleet.placeable).
    LookupError says what is wrong."""
    alive = fleet.alive()
    if gpu:
        found = next((g for g in alive if g.id == gpu or g.device == gpu), None)
        if found is None:
            names = ", ".join(g.id for g in alive) or "none"
            raise LookupError(f"GPU {gpu!r} is not in the fleet (alive: {names})")
        if found.draining:
            raise LookupError(f"GPU {found.id} takes no new loads: its node {found.node} is draining (`prewarm "
                              f"undrain {found.node}` takes it back); name another GPU or leave the choice to prewarm")
        if not found.fresh:
            raise LookupError(f"GPU {found.id} takes no new loads while its heartbeat is late "
                              f"({state.late_reason(found, time.time())}: stopped or stalled?); name another "
                              "GPU or leave the choice to prewarm")
        return found
    if not alive:
        raise LookupError("no GPU in the fleet: start a worker with `prewarm worker`")
    placeable = fleet.placeable()
    if not placeable:
        raise LookupError(f"no GPU takes new loads now{late_note(fleet)}")
    size = entry.size_bytes
    if size > max(g.total_bytes for g in alive):
        raise LookupError(f"model needs {format_bytes(size)}, more than any GPU holds "
                          f"(largest {format_bytes(max(g.total_bytes for g in alive))})")
    best = ranked(r, fleet, catalog, entry, max_loads)
    if best:
        return best[0]
    fallback = roomiest(Room(g.id, g.node, g.free_bytes, 0) for g in placeable)
    assert fallback is not None  # placeable is not empty
    return next(g for g in placeable if g.id == fallback.gpu)


def evict_targets(r: redis.Redis, gpus: list[state.Gpu], model: str, version: str) -> list[state.Gpu]:
    """The GPUs (of `gpus`) an evict of model@version acts on: those with a replica of it in any state, and
    those with a preload of it dispatched but not yet visible as a replica (the evict cancels that)."""
    held = state.held_intents(r, [(model, g.id) for g in gpus])
    preloading = {it.gpu for it in held if it.action == "preload" and it.version == version}
    return [g for g in gpus if g.id in preloading
            or any(x.model == model and x.version == version for x in g.replicas)]
