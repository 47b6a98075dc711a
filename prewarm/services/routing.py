"""The route lookup: where a model can be served now, and what to do when it cannot — the core use case of a
request router (the REST hook GET /hooks/route, and any router integration), with no web framework in it.

    answer = routing.lookup(ctx, entry, priority="normal", counted=True, counters=...)

- `ready`: its ready replicas first, least busy first; an open cold-start episode is closed.
- `loading`: a replica on its way (or a preload dispatched, not yet visible): the episode stays open.
- `cold`: nothing: a cold-start episode is opened, one on-demand preload per episode is placed (the claim key,
  then one placement at a time under a Redis lock, each seeing the intents of those before it), and the
  leader scheduler is woken once per episode to plan at once (e.g. make room).
- loading/cold answers carry `eta_seconds` with a `Retry-After` header, the promise recorded for the ETA
  error metric, and the catalog fallback's ready replicas (`fallback`).
- an adapter (catalog runtime "vllm-adapter", issue 29): its replicas are the base replicas holding it
  (each with the base's `endpoint`, `model` = the adapter's name in the OpenAI API, `host` = the base
  replica); with a base replica ready but the adapter in none, `loading` with the ETA of the adapter's
  load and one on-demand adapter load into that base replica (never an engine start); with no base
  replica, the ETA is the base's start plus the adapter's load, and the on-demand path starts the base
  (`cold`), or waits for the one loading (`loading`). The next lookup once the base is ready loads the
  adapter. `base` in the body says which model the adapter is served from.
- `counted`: the lookup is a request, not a router's retry poll (`retry=1`): only requests are counted in
  the per-minute lookup counts (the SLO's window, /api/roi) and by `counters`.

The app's own in-process counters (Prometheus, in the web process) are handed in as `counters`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from prewarm import eta, keys, rooms, state
from prewarm.catalog_entries import ModelEntry
from prewarm.domain import states as rs
from prewarm.domain.action_kinds import DEMAND
from prewarm.store import cold_starts, eta_promises, lookup_counts
from prewarm.units import format_bytes

log = logging.getLogger(__name__)

# Routable replica states, best first: a router sends to `ready`; the others say when it will be.
_ORDER = {name: i for i, name in enumerate(rs.ROUTABLE)}


class Counters(Protocol):
    """What a lookup counts in its app's process (the web's Prometheus counters)."""

    def lookup(self, answer: str) -> None: ...  # ready | loading | cold, once per counted lookup

    def cold_start(self, model: str) -> None: ...  # a new cold-start episode

    def fallback_offer(self, model: str, fallback: str) -> None: ...  # a counted lookup offered a ready fallback


class NoCounters:
    """Counters for a caller that keeps none (tests, tools)."""

    def lookup(self, answer: str) -> None:
        pass

    def cold_start(self, model: str) -> None:
        pass

    def fallback_offer(self, model: str, fallback: str) -> None:
        pass


@dataclass
class Answer:
    body: dict[str, Any]  # the JSON a router reads (GET /hooks/route's body)
    headers: dict[str, str] = field(default_factory=dict)  # Retry-After on loading/cold


def replica_view(rep: state.Replica, gpu: state.Gpu) -> dict[str, Any]:
    # endpoint: where a router sends requests itself (an engine's OpenAI base URL); None: through `infer`.
    view = {"gpu": gpu.id, "queue": gpu.queue, "version": rep.version, "state": rep.state,
            "progress": round(rep.progress, 4), "in_flight": rep.in_flight, "endpoint": rep.endpoint}
    if rep.host:  # an adapter: served at its base replica's endpoint under its own name
        view.update(model=rep.model, host=rep.host)
    return view


def lookup(ctx: Any, entry: ModelEntry, *, priority: str, counted: bool,
           counters: Counters | None = None) -> Answer:
    """Where `entry` is served now, acting on a cold answer as the module docstring says. `priority`: the
    on-demand preload's (the lookup's own, else the model's catalog priority)."""
    counters = counters or NoCounters()
    r = ctx.r
    fleet = state.read_fleet(r, include_stale=False)
    found = [(rep, g) for g in fleet.alive() for rep in g.replicas
             if rep.model == entry.id and rep.version == entry.version and rep.state in _ORDER]
    # Ready first; among ready, the least busy; then the furthest along.
    found.sort(key=lambda p: (_ORDER[p[0].state], p[0].in_flight, -p[0].progress, p[1].id))
    body: dict[str, Any] = {"model": entry.id, "version": entry.version,
                            "replicas": [replica_view(rep, g) for rep, g in found]}
    if entry.is_adapter:
        body["base"] = entry.base
    base_ready = _base_ready(ctx, entry, fleet) if entry.is_adapter else []
    via_base = False  # an adapter whose base has no ready replica: its ETA is the base's start plus its load
    base_entry = ctx.catalog.get(entry.base) if entry.is_adapter and entry.base in ctx.catalog else None
    if found and found[0][0].state == rs.READY:
        body["state"] = rs.ROUTE_READY
        cold_starts.close_ready(r, fleet, [entry.id])
    elif found or _preload_in_flight(r, entry, fleet):
        body["state"] = rs.ROUTE_LOADING
        _open_cold_start(r, entry, counters)
    elif base_entry is not None and base_ready:
        # The base runs: loading the adapter into it is all it takes (well under a second), never an engine start.
        body["state"] = rs.ROUTE_LOADING
        _open_cold_start(r, entry, counters)
        body["preload"] = _on_demand_preload(ctx, entry, fleet, priority,
                                             place=lambda: _place_adapter(ctx, entry, base_ready, priority))
    elif base_entry is not None and _ready_of(base_entry, fleet):
        # Every ready base replica's LoRA slots are taken: the scheduler makes room (unloads an adapter).
        body["state"] = rs.ROUTE_LOADING
        if _open_cold_start(r, entry, counters):
            _wake_scheduler(r, entry)
        body["preload"] = {"queued": False, "message": f"every ready replica of its base {base_entry.id} has all "
                                                       f"its {base_entry.max_adapters} LoRA slot(s) taken; the "
                                                       "scheduler will make room"}
    elif base_entry is not None:
        # No base replica ready: the base starts first (once: the base's own on-demand path), then the adapter.
        via_base = True
        new_episode = _open_cold_start(r, entry, counters)
        base_found = any(x.model == base_entry.id and x.version == base_entry.version and x.state in _ORDER
                         for g in fleet.alive() for x in g.replicas)
        if base_found or _preload_in_flight(r, base_entry, fleet):
            body["state"] = rs.ROUTE_LOADING
        else:
            body["state"] = rs.ROUTE_COLD
            _open_cold_start(r, base_entry, counters)
            body["preload"] = _on_demand_preload(ctx, base_entry, fleet, priority)
            if new_episode:
                _wake_scheduler(r, base_entry)
    else:
        body["state"] = rs.ROUTE_COLD
        new_episode = _open_cold_start(r, entry, counters)
        body["preload"] = _on_demand_preload(ctx, entry, fleet, priority)
        if new_episode:  # once per cold episode (its HSETNX claim), not on every router retry
            _wake_scheduler(r, entry)
    headers = {} if body["state"] == rs.ROUTE_READY else _cold_fields(ctx, body, entry, fleet, counted, counters,
                                                                       via_base=via_base)
    if counted:
        counters.lookup(body["state"])
        _count_lookup(r, body)
    return Answer(body, headers)


def _open_cold_start(r: redis.Redis, entry: ModelEntry, counters: Counters) -> bool:
    """Open an episode (the worker closes it when the replica turns ready; a lookup that sees a ready replica
    first may close it too, exactly once either way); True (and counted) when this lookup opened a new one."""
    if cold_starts.open_episode(r, entry.id, entry.version):
        counters.cold_start(entry.id)
        return True
    return False


def _wake_scheduler(r: redis.Redis, entry: ModelEntry) -> None:
    """Wake the leader scheduler to plan now (e.g. make room by evicting) rather than at its next tick.
    Fire-and-forget: a lost wake-up only costs the wait for that tick, so a failure never fails the lookup."""
    try:
        r.publish(keys.WAKE, entry.key)
    except redis.RedisError as exc:
        log.warning("could not wake the scheduler for %s: %s", entry.key, exc)


def _preload_in_flight(r: redis.Redis, entry: ModelEntry, fleet: state.Fleet) -> bool:
    """A preload already dispatched (by anyone) but not yet visible as a replica."""
    held = state.held_intents(r, [(entry.id, g.id) for g in fleet.alive()])
    return any(it.action == "preload" and it.version == entry.version for it in held)


def _base_ready(ctx: Any, entry: ModelEntry, fleet: state.Fleet) -> list[tuple[state.Replica, state.Gpu]]:
    """An adapter's base replicas that are ready and have a LoRA slot free (fewer adapters hosted than the
    base's max_adapters), least busy first: where an on-demand adapter load can go."""
    if entry.base not in ctx.catalog:
        return []
    base = ctx.catalog.get(entry.base)
    out = []
    for g in fleet.alive():
        for x in g.replicas:
            if x.model != base.id or x.state != rs.READY:
                continue
            key = f"{x.model}@{x.version}"
            hosted = sum(1 for y in g.replicas if y.host == key and y.state != rs.FAILED)
            if hosted < base.max_adapters:
                out.append((x, g))
    out.sort(key=lambda p: (p[0].in_flight, p[1].id))
    return out


def _place_adapter(ctx: Any, entry: ModelEntry, hosts: list[tuple[state.Replica, state.Gpu]],
                   priority: str) -> dict[str, Any]:
    """The on-demand adapter load: into the least busy ready base replica with a free slot."""
    d = None
    for base_rep, gpu in hosts:
        d = ctx.dispatcher.preload(entry.id, entry.version, gpu, actor="router", kind=DEMAND, priority=priority,
                                   reason=f"route lookup found the adapter absent from its ready base "
                                          f"{base_rep.model}@{base_rep.version}: on-demand adapter load",
                                   numbers={"size_bytes": entry.size_bytes, "free_bytes": gpu.free_bytes})
        if d.sent:
            return {"queued": True, "gpu": d.gpu, "host": f"{base_rep.model}@{base_rep.version}",
                    "message": d.message}
    return {"queued": False, "message": d.message if d is not None else "no ready base replica has a free slot"}


def _on_demand_preload(ctx: Any, entry: ModelEntry, fleet: state.Fleet, priority: str,
                       place: Any = None) -> dict[str, Any]:
    r = ctx.r
    claim = keys.cold_claim(entry.key)
    # One on-demand preload per cold episode, however many routers ask at once.
    if not r.set(claim, f"{time.time():.3f}", nx=True, px=int(ctx.settings.intent_ttl * 1000)):
        return {"queued": False, "message": "an on-demand preload is already in flight"}
    answer: dict[str, Any] = {
        "queued": False, "message": "other on-demand preloads are being placed; the scheduler will place this one"}
    try:
        # One placement at a time: each sees the intents of those before it (a few ms each).
        lock = r.lock(keys.ON_DEMAND_LOCK, timeout=5.0, blocking_timeout=2.0)
        if lock.acquire():
            try:
                answer = place() if place is not None else _place_on_demand(ctx, entry, fleet, priority)
            finally:
                try:
                    lock.release()
                except redis.exceptions.LockError:
                    pass  # held past its timeout (a stalled placement): it has expired already
        return answer
    finally:
        if not answer["queued"]:
            r.delete(claim)  # nothing sent (or it failed): let the next lookup try again


def _place_on_demand(ctx: Any, entry: ModelEntry, fleet: state.Fleet, priority: str) -> dict[str, Any]:
    # The placement rule's order (prewarm.rooms.ranked): a node holding a staged copy first (a promotion
    # from host memory, not a storage read), then a free load slot (on a full GPU the preload would queue
    # behind its loads), fewer loads, the tightest fit; a GPU busy with another action on this model
    # (e.g. loading its other version) refuses the intent, so the next one is tried.
    # Only GPUs with a fresh heartbeat are in it: a late one (its worker stopped?) is not a fallback either.
    # With PREWARM_LINK_WAIT on (the default), only a GPU whose link is idle: whether a load shares a busy link or
    # waits for it is the scheduler's choice (placement.place), which the lookup wakes at once.
    idle_link = ctx.settings.link_wait
    order = rooms.ranked(ctx.r, fleet, ctx.catalog, entry, ctx.settings.max_loads_per_gpu, idle_link)
    if not order:
        where = "no GPU in the fleet" if not fleet.alive() else \
            f"no GPU has {format_bytes(entry.size_bytes)} free{' and an idle link' if idle_link else ''}" \
            f"{rooms.late_note(fleet)}; the scheduler will make room{' or wait for a link' if idle_link else ''}"
        return {"queued": False, "message": where}
    staged = rooms.staged_nodes(fleet, entry)
    for gpu in order:
        d = ctx.dispatcher.preload(entry.id, entry.version, gpu, actor="router", kind=DEMAND, priority=priority,
                                   reason="route lookup found the model cold: on-demand preload",
                                   numbers={"size_bytes": entry.size_bytes, "free_bytes": gpu.free_bytes,
                                            "staged": gpu.node in staged})
        if d.sent:
            return {"queued": True, "gpu": d.gpu, "message": d.message}
    return {"queued": False, "message": d.message}


def _ready_of(entry: ModelEntry, fleet: state.Fleet) -> bool:
    return any(x.model == entry.id and x.version == entry.version and x.state == rs.READY
               for g in fleet.alive() for x in g.replicas)


def _cold_fields(ctx: Any, body: dict[str, Any], entry: ModelEntry, fleet: state.Fleet, counted: bool,
                 counters: Counters, *, via_base: bool = False) -> dict[str, str]:
    """Add eta_seconds (and fallback, when the catalog names one) to a loading/cold `body`; returns the
    headers to send."""
    now = time.time()
    # With no load placed (no room yet), the scheduler makes room at its wake-up: about one tick more.
    seconds = eta.model_eta(ctx.r, ctx.catalog, fleet, entry.id, entry.version, ctx.settings.max_loads_per_gpu,
                            now, ctx.settings.tick_seconds)
    if via_base:
        # No base replica is ready: the base's start (or the rest of it) comes first, then the adapter's load.
        base = ctx.catalog.get(entry.base)
        base_s = eta.model_eta(ctx.r, ctx.catalog, fleet, base.id, base.version, ctx.settings.max_loads_per_gpu,
                               now, ctx.settings.tick_seconds)
        seconds = base_s + eta.expected_seconds(ctx.catalog, eta.read_measured(ctx.r, [entry.id]), entry.id,
                                                entry.version, False)
        body["base_eta_seconds"] = round(base_s, 2)
    body["eta_seconds"] = round(seconds, 2)
    eta_promises.promise(ctx.r, entry.id, entry.version, seconds, now)
    fb = fallback_answer(ctx.catalog, entry, fleet)
    if fb is not None:
        body["fallback"] = fb
        if counted and fb["replicas"]:
            counters.fallback_offer(entry.id, fb["model"])
    return {"Retry-After": eta.retry_after(seconds)}


def fallback_answer(catalog: Any, entry: ModelEntry, fleet: state.Fleet) -> dict[str, Any] | None:
    """The first model along the entry's fallback chain with a ready replica, with those replicas (least
    busy first); the direct fallback with none when nothing along the chain is ready; None: no fallback."""
    first: dict[str, Any] | None = None
    name = entry.fallback
    while name is not None and name in catalog:  # the catalog refuses cycles and unknown names
        fb = catalog.get(name)
        ready = sorted(((x, g) for g in fleet.alive() for x in g.replicas
                        if x.model == fb.id and x.version == fb.version and x.state == rs.READY),
                       key=lambda p: (p[0].in_flight, p[1].id))
        answer = {"model": fb.id, "version": fb.version, "replicas": [replica_view(x, g) for x, g in ready]}
        if ready:
            return answer
        first = first or answer
        name = fb.fallback
    return first


def _count_lookup(r: redis.Redis, body: dict[str, Any]) -> None:
    """Count a lookup that is a request in its minute: ready on the replica named first, or not ready."""
    first = body["replicas"][0] if body["state"] == rs.ROUTE_READY else None
    ready_on = (body["model"], first["version"], first["gpu"]) if first else None
    lookup_counts.count_lookup(r, body["model"], ready_on, time.time())
