"""Where a load goes; every GPU choice in prewarm is made here.

- `rank`: the one rule for a GPU that has room now, used by every caller (the planner's place(), the
  baselines' `choose`, the route hook's on-demand preload, the operator CLI and API);
- `roomiest`: an operator's or on-demand load when no GPU has room now (the worker makes room there);
- `place`: the planner's choice, which also costs evictions when no idle GPU has room (a baseline costs
  them by its own eviction order instead: prewarm.domain.baselines.placement)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from prewarm.domain.action_kinds import DEMAND, SPECULATIVE

from .types import GIB, ModelSpec, Placement, ReplicaState
from .value import Values, load_seconds, promote_seconds

# How far ahead an eviction's cost is counted when choosing a GPU: each victim costs its expected cold requests
# over this horizon, capped at one reload. Short, the choice follows the victims' demand rates (a replica
# that would return in minutes costs little more than one that would not); long, it counts reloads, one per
# victim, whatever its rate. Measured (ServeGen 24 h on 16 × 80 GiB: 5 s 51,411 cold starts, 10 s 51,213,
# 15 s 51,576, 30 s 52,421, 60 s 53,116; FaasCache 51,821), and on the full sweep of both families
# (docs/simulation.md, "The GPU choice's eviction horizon"): 10 s, on fleets whose loads take seconds; where the
# catalog's median load is longer, that (`horizon`).
EVICTION_HORIZON_S = 10.0
# Up to this many victims, a placement keeps the cheapest of them that still make room (`cheapest_cover`); more
# are small beside the room needed, and the order's prefix is near the cheapest
COVER_VICTIMS = 12


@dataclass(frozen=True)
class Room:
    """One GPU as a placement sees it."""

    gpu: str
    node: str
    free_bytes: int  # what a new load can have: measured free less what loads already sent will take
    loads: int  # loads in flight or queued on it (sent but unconfirmed ones included)


def rank(rooms: Iterable[Room], size: int, staged: Collection[str] = (), exclude: Collection[str] = (),
         max_loads: int = 0) -> list[Room]:
    """The GPUs that can take a load of `size` bytes without evicting anything, best first:
    on a node in `staged` (its host cache holds the model: a promotion, not a storage read), then
    with a free load slot (fewer than `max_loads` loads; 0: no limit; on a full one the load queues
    behind the others), then the fewest loads sharing its link, then the tightest fit (the least
    left over: large gaps stay for large models), then by id. `exclude`: GPU ids not to use."""
    fits = [r for r in rooms if r.free_bytes >= size and r.gpu not in exclude]
    fits.sort(key=lambda r: (r.node not in staged, 0 < max_loads <= r.loads, r.loads, r.free_bytes - size, r.gpu))
    return fits


def roomiest(rooms: Iterable[Room]) -> Room | None:
    """No GPU has room now: the one with the most free memory, where the fewest evictions are likely
    needed (the worker makes room there by its own order, or refuses saying why); ties: the last id."""
    best: Room | None = None
    for r in rooms:
        if best is None or (r.free_bytes, r.gpu) > (best.free_bytes, best.gpu):
            best = r
    return best


def outranks(v: Values, model: str, spec: ModelSpec) -> bool:
    """A replica of `model` is never evicted for a speculative load of a lower-priority `spec`: a guess
    about the future does not displace what the operator ranked above it (a demand load may)."""
    other = v.models.get(model)
    return other is not None and other.priority > spec.priority


def place(v: Values, spec: ModelSpec, kind: str, benefit: float = math.inf) -> Placement | None:
    """Choose a GPU (and victims) for one more replica of spec; None: no GPU will do."""
    f = v.fleet
    cfg = v.cfg
    size = spec.size_bytes
    speculative = kind == SPECULATIVE
    reach = horizon(v)
    hosting = f.of_model.get(spec.id, [])
    ld_storage = load_seconds(spec, cfg)
    rate = v.request_rate(spec.id)
    nodes_with = {f.gpus[g].node for g in hosting if g in f.gpus}
    # Nodes holding it in host memory: a load there is a promotion, not a storage read.
    staged_on = f.staged_nodes.get(spec.id, ())
    ld_host = promote_seconds(spec, cfg) if staged_on else ld_storage
    best: tuple | None = None
    order = sorted(f.gpus)
    own_order = v.own_order()
    yields = kind == DEMAND and cfg.fill_yields  # fills give way to it (PlanCall.yield_link)
    if not speculative:
        # an idle GPU with room on a node without this model costs nothing (no victims, no link
        # contention): take rank()'s first, with no need to cost evictions elsewhere
        # (a GPU hosting the model is on a node in nodes_with)
        # (a link that carries only fills is idle for a demand load: they give way, PlanCall.yield_link; one
        # with none goes first, rank()'s fewest loads, so that no fill is cancelled where none need be)
        idle = [Room(gid, f.gpus[gid].node, f.avail(gid), f.loading[gid]) for gid in order
                if (f.loading[gid] == 0 or (yields and f.loading[gid] == len(v.yielding(gid))))
                and f.gpus[gid].node not in nodes_with
                and (not v.held or v.held.get(gid, spec.id) == spec.id)]
        easy = rank(idle, size, staged_on,
                    {gid for gid in order if (spec.id, gid) in f.evicting} if f.evicting else ())
        if easy:
            return Placement(easy[0].gpu, [], 0.0)
    # Cost = victims (>= 0) + link contention, so (node spread, contention) is a lower bound on
    # a GPU's key: visit GPUs in that order and stop once the bound passes the best found.
    bounded = []
    # (each dict read once per GPU, and an empty one not read: this loop runs for every GPU on every placement)
    evicting, held, loading = f.evicting, v.held, f.loading
    for gid in order:
        g = f.gpus[gid]
        if gid in hosting or g.total_bytes < size or (evicting and (spec.id, gid) in evicting):
            continue
        if held and held.get(gid, spec.id) != spec.id:
            continue  # held for an overdue model
        k = loading[gid]
        if speculative and k >= cfg.max_speculative_loads_per_gpu:
            continue
        if cfg.max_loads_per_gpu and k >= cfg.max_loads_per_gpu:
            continue
        if k and yields:
            k -= len(v.yielding(gid))  # fills give way to a demand load (PlanCall.yield_link)
        ld = ld_host if g.node in staged_on else ld_storage
        contention = ld * (rate * k + v.loading_rate(gid)) if k else 0.0
        if staged_on:
            # where the load time differs by GPU, count our own requests waiting through it
            contention += rate * ld
        waits = -1.0  # seconds until the link frees where the load waits for it; -1: it does not wait
        if k and cfg.link_wait and kind == DEMAND:
            # a busy link: sharing it slows its loads and ours; waiting for its first load to end slows none of
            # theirs, and ours ends about when it would have shared (the link does the same work)
            frees = free_in(v, gid)
            wait = rate * (frees + cfg.tick_s)
            if wait < contention:
                contention, waits = wait, frees
        bounded.append((g.node in nodes_with, contention, gid, waits))
    bounded.sort()
    for spread, contention, gid, waits in bounded:
        if best is not None and (spread, contention) > best[0][:2]:
            break
        g = f.gpus[gid]
        spec_cap = cfg.speculative_share * g.total_bytes
        free = f.avail(gid)
        victims: list[ReplicaState] = []
        worth_of: list[float] = []  # each victim's value: its order's value per byte times its bytes
        loss = 0.0
        if free < size:
            freed = 0
            spec_freed = 0
            for vpb, _m, r in v.victim_list(gid):
                if v.floors and r.model in v.floors and not v.evictable(r):
                    continue  # its replica count dropped to its floor during this call
                if speculative and outranks(v, r.model, spec):
                    continue
                worth = vpb * r.bytes / GIB
                if speculative and worth * cfg.prefetch_margin > benefit:
                    break  # this victim alone is worth more than the prefetch
                victims.append(r)
                worth_of.append(worth)
                freed += r.bytes
                loss += worth
                if v.is_speculative(r):
                    spec_freed += r.bytes
                if free + freed >= size:
                    break
            if free + freed < size:
                continue
            if 1 < len(victims) <= COVER_VICTIMS and own_order and not speculative:
                # the order's prefix may hold victims that its last one made needless (a large last victim); not
                # for a load ahead, which a cheaper set would make pass its benefit test more often (measured worse)
                picked = cheapest_cover([(w, r.bytes) for w, r in zip(worth_of, victims, strict=True)], size - free,
                                        loss)
                if picked is not None:
                    victims = [victims[i] for i in picked]
                    loss = sum(worth_of[i] for i in picked)
            if speculative and f.spec[gid] - spec_freed + size > spec_cap:
                continue
        elif speculative and f.spec[gid] + size > spec_cap:
            continue
        # Expected cold requests this choice causes: the victims' next reloads (their loss rate
        # over the eviction horizon, at most one reload each) plus load-link contention: k
        # loads in flight make ours ~k× slower (our requests wait through it) and each of
        # theirs slower by about our load time (theirs wait too).
        cost = contention + sum(
            min(v.cost(r.model), v.loss(r.model) * reach) for r in victims)
        key = (spread, cost, f.loading[gid], free - size, gid)
        if best is None or key < best[0]:
            best = (key, gid, victims, loss, waits)
    if best is None:
        return None
    if best[4] >= 0.0:
        v.link_waits.append((spec.id, best[1], best[4]))
        return None
    if speculative and best[3] * cfg.prefetch_margin > benefit:
        return None
    return Placement(best[1], best[2], best[3])


def horizon(v: Values) -> float:
    """The eviction horizon (EVICTION_HORIZON_S) in this fleet's own time: at least the catalog's median load.
    10 s was measured where loads take 1–5 s (Azure's median 2.4 s); with ServeGen's (10–38 s, median 38 s) and
    the link wait it counted too few of a victim's requests against a load that takes minutes to undo: 38 s there
    gave −3 % cold starts on 8 and 16 GPUs and the same on 32, while every fleet with short loads keeps 10 s
    (docs/simulation.md, "The eviction horizon in the fleet's own time")."""
    return max(EVICTION_HORIZON_S, v.st.catalog_load_s)


def free_in(v: Values, gid: str) -> float:
    """Seconds until the first load on `gid`'s link ends, at the most: each load counted as if it had shared the
    link with as many loads as now since it started."""
    f = v.fleet
    k = max(f.loading[gid], 1)
    out = math.inf
    for m in f.loading_models[gid]:
        r = f.on_gpu[gid].get(m)
        spec = v.models.get(m)
        if r is None or spec is None:
            continue
        out = min(out, max(0.0, load_seconds(spec, v.cfg) - (v.now - r.since) / k) * k)
    return 0.0 if out == math.inf else out


def cheapest_cover(victims: list[tuple[float, int]], need: int, bound: float) -> list[int] | None:
    """Of the victims (value, bytes) that an order took until they freed `need` bytes, the subset that still frees
    them for the least summed value, as indexes in order, if under `bound` (all of them: the prefix's value);
    None: no victim can be spared.

    The order takes victims by value per byte, which leaves none to spare when replicas are small beside the room
    needed. When they are not (ServeGen's 15 / 29 / 65 GB models on 80 GiB GPUs) its last victim can free the room
    that earlier ones were taken for: those are kept. Exact, by branch and bound over at most COVER_VICTIMS.
    Demand loads only: for loads ahead too, on/off x 4 got worse (11,656 -> 12,359 with the whole experts off); sets
    past the prefix too, Azure 1,350 x 16 got worse (docs/simulation.md, "The cheapest victims")."""
    n = len(victims)
    best: list[int] | None = None
    best_value = bound
    suffix = [0] * (n + 1)  # bytes the victims from i on could still free
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + victims[i][1]
    chosen: list[int] = []

    def visit(i: int, freed: int, value: float) -> None:
        nonlocal best, best_value
        if freed >= need:
            if value < best_value:
                best, best_value = list(chosen), value
            return
        if i == n or freed + suffix[i] < need:
            return
        if value + victims[i][0] < best_value:
            chosen.append(i)
            visit(i + 1, freed + victims[i][1], value + victims[i][0])
            chosen.pop()
        visit(i + 1, freed, value)

    visit(0, 0, 0.0)
    return best
