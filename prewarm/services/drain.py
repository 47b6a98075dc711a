"""Draining a node: one use case behind `prewarm drain`/`undrain`, `POST`/`DELETE /api/nodes/<node>/drain`, the
worker's SIGTERM (gpu_worker/drain.py) and the leader scheduler's drain round.

A draining node takes no new preloads (state.Fleet.placeable leaves its GPUs out of every placement). Its
ready replicas that still have demand (prewarm.domain.drain: pinned, min_replicas, traffic in the last
window) get a replacement on another node first — `drain_round`, run by the leader every tick, sends the
preloads (kind "drain"), placed by the one placement rule (prewarm.rooms.ranked) — and only once none of
them needs a home does the node's worker evict its replicas (kind "drain") and exit: make-before-break, as
the `max_replica_age` refresh replaces an old replica (prewarm/domain/policy/refresh.py).

The planner never sees a draining node's GPUs (the snapshot is made of placeable GPUs), so it plans around
them as around a GPU whose heartbeat is late; the round runs before the plan is dispatched, and the plan's
preloads of a model the round just placed are dropped (scheduler/live.py), so the two never load it twice.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis

from prewarm import keys, rooms, state, traffic
from prewarm.catalog_entries import Catalog
from prewarm.dispatch import Dispatched, order_preload
from prewarm.domain import drain as rule
from prewarm.domain import states as rs
from prewarm.domain.action_kinds import DRAIN
from prewarm.store import drains, overlays

log = logging.getLogger(__name__)

# "Traffic in the last window": a request within this long keeps a model wanted through a drain. The span
# of the per-second traffic buckets (prewarm.traffic.SECOND_TTL_S): what the scheduler calls recent.
DEMAND_WINDOW_S = float(traffic.SECOND_TTL_S)
WAKE_PREFIX = "drain:"  # keys.WAKE message of a drain begun: "drain:<node>" (the leader ticks at once)


class UnknownNode(LookupError):
    """A drain or undrain names a node with no live GPU in the fleet (and no drain record)."""

    def __init__(self, node: str, fleet: state.Fleet) -> None:
        names = ", ".join(sorted({g.node for g in fleet.alive()})) or "none"
        self.message = f"node {node!r} is not in the fleet (nodes with a live worker: {names})"
        super().__init__(self.message)


@dataclass(frozen=True)
class Replacement:
    """A preload the drain round sent: model@version's new home on `gpu`."""

    model: str
    version: str
    gpu: str
    sent: Dispatched


@dataclass(frozen=True)
class Begun:
    drain: drains.Drain
    new: bool  # False: the node was draining already (nothing changed)
    gpus: tuple[str, ...]  # the node's live GPUs

    @property
    def message(self) -> str:
        d = self.drain
        if not self.new and not d.draining:
            return f"{d.node} is drained already: its worker is on its way out"
        if not self.new:
            return f"{d.node} is draining already (since {time.strftime('%H:%M:%S', time.localtime(d.since))}, " \
                   f"{d.actor}: {d.reason})"
        return (f"{d.node} draining: no new preloads; its replicas with demand are loaded elsewhere first, then "
                f"evicted, and its worker exits (within {d.grace_s:g} s)")

    def public(self) -> dict[str, Any]:
        return {"node": self.drain.node, "draining": self.drain.draining, "new": self.new, "gpus": list(self.gpus),
                "drain": self.drain.public(), "message": self.message}


def _node_gpus(fleet: state.Fleet, node: str) -> list[state.Gpu]:
    return [g for g in fleet.alive() if g.node == node]


def begin(r: redis.Redis, node: str, *, actor: str, reason: str, grace_s: float, maxlen: int = 5000,
          now: float | None = None) -> Begun:
    """Mark `node` draining (idempotent: a second call changes nothing) and wake the leader scheduler.
    UnknownNode when the node has no live GPU and is not draining already."""
    now = time.time() if now is None else now
    fleet = state.read_fleet(r, include_stale=False)
    gpus = _node_gpus(fleet, node)
    held = fleet.drain_records.get(node)
    if not gpus and not (held is not None and held.draining):
        raise UnknownNode(node, fleet)
    d, new = drains.begin(r, node, actor=actor, reason=reason, grace_s=grace_s,
                          worker=gpus[0].worker if gpus else "", now=now, maxlen=maxlen)
    if new:
        wake(r, node)
    return Begun(d, new, tuple(g.id for g in gpus))


def end(r: redis.Redis, node: str, *, actor: str, reason: str, maxlen: int = 5000,
        now: float | None = None) -> drains.Drain | None:
    """Take `node` back (it takes loads again); the drain undone, or None when it was not draining.
    UnknownNode when it has neither a drain record nor a live GPU."""
    now = time.time() if now is None else now
    done = drains.end(r, node, actor=actor, reason=reason, now=now, maxlen=maxlen)
    if done is None:
        fleet = state.read_fleet(r, include_stale=False)
        if not _node_gpus(fleet, node):
            raise UnknownNode(node, fleet)
    return done


def wake(r: redis.Redis, node: str) -> None:
    """Ask the leader to run its drain round now, not at its next tick (fire-and-forget, as the route hook's)."""
    try:
        r.publish(keys.WAKE, WAKE_PREFIX + node)
    except redis.RedisError as exc:
        log.warning("could not wake the scheduler for the drain of %s: %s", node, exc)


def draining_nodes(fleet: state.Fleet) -> set[str]:
    return {n for n, d in fleet.drain_records.items() if d.draining}


def demand(r: redis.Redis, catalog: Catalog, models: set[str], now: float) -> dict[str, rule.Demand]:
    """Each model's demand by the catalog, the operator's pins and the last window's traffic."""
    if not models:
        return {}
    pinned = overlays.pinned(r)
    last = traffic.last_requests(r, models)
    out = {}
    for m in models:
        entry = catalog.get(m) if m in catalog else None
        out[m] = rule.Demand(pinned=m in pinned or bool(entry and entry.pinned),
                             min_replicas=entry.min_replicas if entry else 0,
                             recent_traffic=now - last.get(m, -float("inf")) <= DEMAND_WINDOW_S)
    return out


def needs(r: redis.Redis, catalog: Catalog, fleet: state.Fleet, now: float,
          nodes: set[str] | None = None) -> list[rule.Need]:
    """The ready replicas of the draining nodes (or of `nodes`) that need a home (prewarm.domain.drain)."""
    nodes = draining_nodes(fleet) if nodes is None else nodes
    held = [rule.Held(x.model, x.version, g.id) for g in fleet.alive() if g.node in nodes for x in g.replicas
            if x.state == rs.READY]
    if not held:
        return []
    homes = fleet.placeable()
    ready = Counter((x.model, x.version) for g in homes for x in g.replicas if x.state == rs.READY)
    loading = Counter((x.model, x.version) for g in homes for x in g.replicas if x.state in rs.IN_FLIGHT)
    by_id = {g.id: g for g in homes}
    models = sorted({h.model for h in held})
    for it in state.held_intents(r, [(m, gid) for m in models for gid in by_id]):
        shown = any(x.model == it.model and x.version == it.version for x in by_id[it.gpu].replicas)
        if it.action == "preload" and not shown:
            loading[(it.model, it.version)] += 1  # dispatched, not yet visible as a replica
    return rule.needs(held, demand(r, catalog, {h.model for h in held}, now), ready, loading)


def drain_round(ctx: Any, fleet: state.Fleet, now: float | None = None) -> list[Replacement]:
    """The leader's round: a replacement preload for every replica of a draining node that needs a home and
    has none coming, on the placement rule's best other GPU. The preloads sent (refused ones left out:
    another action in flight there is tried again next tick)."""
    if not draining_nodes(fleet):
        return []
    now = time.time() if now is None else now
    catalog = ctx.catalog
    sent: list[Replacement] = []
    for need in needs(ctx.r, catalog, fleet, now):
        if need.to_load == 0:
            continue
        try:
            entry = catalog.get(need.model, need.version)
        except KeyError:
            continue  # a version the catalog no longer has: nothing can load it
        targets = rooms.ranked(ctx.r, fleet, catalog, entry, ctx.settings.max_loads_per_gpu)[:need.to_load]
        if not targets:
            # every tick until there is room: the worker says at the grace's end what found no home
            log.debug("drain: no other GPU has room for %s (%s) yet; its replica on %s stays until one has or the "
                      "drain's grace ends", entry.key, need.why, ", ".join(need.gpus))
            continue
        for g in targets:
            reason = (f"drain: {', '.join(need.gpus)} draining; {entry.key} ({need.why}) wants {need.wanted} ready "
                      f"replica(s) elsewhere, {need.ready_elsewhere} ready → preload on {g.id} (the draining "
                      "replica is evicted once this one is ready)")
            order = order_preload(entry.id, entry.version, g, actor="scheduler", reason=reason, kind=DRAIN,
                                  numbers={"wanted": need.wanted, "ready_elsewhere": need.ready_elsewhere,
                                           "from": list(need.gpus)},
                                  priority=entry.priority, result=False)
            for d in ctx.dispatcher.send_many([order]):
                if isinstance(d, Exception):
                    log.error("drain: preload of %s on %s failed: %s", entry.key, g.id, d)
                elif d.sent:
                    log.info("drain: %s", reason)
                    sent.append(Replacement(entry.id, entry.version, g.id, d))
    return sent
