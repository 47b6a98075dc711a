"""Replica refresh by age (catalog `max_replica_age`): a replica older than its model's limit is replaced
make-before-break, so the model's ready count never drops below what it had.

One model at a time, oldest stale replica first, each tick:
1. a stale replica with a fresh replacement — a ready replica of the model, itself within the limit, whose
   load started after the stale one passed its limit, not already paired with another — is evicted
   (`refresh`); each replacement pays for one stale replica;
2. else, while a load of the model is in flight, wait for it (it may be the replacement);
3. else load a replacement (`refresh`) on a GPU that has the room free now and an idle load link (no
   eviction and no bandwidth taken from another load: a refresh is upkeep, not demand), never on a GPU
   that holds the model (one replica of a model per GPU), best by placement.rank;
4. no such GPU: the stale replica stays, and a `Keep` says why (the live scheduler logs it once).

Age = now − the replica's ready time (its load start where the record has none). Pure: no I/O, no clock.
"""

from __future__ import annotations

from prewarm.domain.action_kinds import REFRESH
from prewarm.domain.states import IN_FLIGHT, READY

from .placement import Room, rank
from .plan_call import PlanCall
from .types import GIB, Evict, Keep, ReplicaState
from .words import fmt_s


def aged_models(pl: PlanCall) -> tuple[str, ...]:
    """The catalog's models with a max_replica_age, re-read only when the models mapping changes."""
    st, models = pl.st, pl.s.models
    if st.aged_of is not models:
        st.aged = tuple(sorted(m for m, sp in models.items() if sp.max_replica_age_s))
        st.aged_of = models
    return st.aged


def age(r: ReplicaState, now: float) -> float:
    return now - (r.ready_at if r.ready_at is not None else r.since)


def step_refresh(pl: PlanCall) -> None:
    for m in aged_models(pl):
        refresh_model(pl, m)


def refresh_model(pl: PlanCall, m: str) -> None:
    spec = pl.s.models[m]
    limit = spec.max_replica_age_s
    f = pl.fleet
    hosts = f.of_model.get(m)
    if not hosts or limit is None:
        return
    now = pl.now
    ready: list[ReplicaState] = []
    in_flight = False  # a load (or an unconfirmed preload) of the model
    for g in hosts:
        r = f.on_gpu[g].get(m)
        if r is None or r.state in IN_FLIGHT:
            in_flight = True
        elif r.state == READY and (m, g) not in f.evicting:
            ready.append(r)
    stale = sorted((r for r in ready if age(r, now) > limit), key=lambda r: (-age(r, now), r.gpu))
    if not stale:
        return
    fresh = sorted((r for r in ready if age(r, now) <= limit), key=lambda r: (r.since, r.gpu))
    used: set[str] = set()
    for old in stale:
        stale_at = now - age(old, now) + limit
        new = next((r for r in fresh if r.gpu not in used and r.since >= stale_at), None)
        if new is not None:
            if old.in_flight > 0 or (m, old.gpu) in f.evicting:
                continue  # serving a request now: evicted at a later tick, once idle
            used.add(new.gpu)
            f.evict(old, pl.is_speculative(old))
            pl.actions.append(Evict(
                m, old.gpu, REFRESH,
                f"refresh: replica on {old.gpu} is {fmt_s(age(old, now))} old, over max_replica_age "
                f"{fmt_s(limit)}; its replacement on {new.gpu} is ready → evict the old one",
                {"age_s": age(old, now), "max_age_s": limit, "replacement_age_s": age(new, now),
                 "gib": old.bytes / GIB}, old.version))
            continue
        if in_flight:
            return  # a load of the model is under way: it may be this one's replacement
        load_replacement(pl, old, limit)
        return


def load_replacement(pl: PlanCall, old: ReplicaState, limit: float) -> None:
    f, cfg, m = pl.fleet, pl.cfg, old.model
    spec = pl.s.models[m]
    rooms = [Room(g, f.gpus[g].node, f.avail(g), f.loading[g]) for g in sorted(f.gpus)
             if f.loading[g] == 0 and m not in f.on_gpu[g] and (m, g) not in f.evicting]
    order = rank(rooms, spec.size_bytes, f.staged_nodes.get(m, ()), (), cfg.max_loads_per_gpu)
    a = age(old, pl.now)
    if not order:
        pl.actions.append(Keep(
            m, old.gpu, "refresh_blocked",
            f"refresh: replica on {old.gpu} is {fmt_s(a)} old, over max_replica_age {fmt_s(limit)}, but no "
            f"other GPU has {spec.size_bytes / GIB:.1f} GiB free and an idle load link: it stays until one "
            f"has (a replica is only replaced once its replacement is ready)",
            {"age_s": a, "max_age_s": limit, "gib": spec.size_bytes / GIB}, old.version))
        return
    gid = order[0].gpu
    pl.do_preload(spec, gid, REFRESH,
                  f"refresh: replica on {old.gpu} is {fmt_s(a)} old, over max_replica_age {fmt_s(limit)} → "
                  f"preload a fresh replica on {gid} (the old one is evicted once this one is ready)",
                  {"age_s": a, "max_age_s": limit, "gib": spec.size_bytes / GIB})
