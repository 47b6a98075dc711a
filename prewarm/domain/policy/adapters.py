"""LoRA adapters in the plan (issue 29, item 4): models with a host.

An adapter (`ModelSpec.base` set) is served only inside a ready replica of its base, in one of that replica's
`max_adapters` LoRA slots (vLLM's --max-loras). Its load into a running engine takes well under a second
where the base's engine start takes tens of seconds, so the two are planned apart:

    actions = plan_with_adapters(snapshot, now, state)

1. the bases (and every whole model) are planned by `plan()` on the snapshot without the adapters, where each
   base's traffic already counts the requests of all its adapters (`traffic_keys`: the caller feeds an
   adapter's request under the base's key too, so a base whose adapters are busy is worth its memory although
   no request names it), and an adapter's waiting requests wait for its base when no base replica is ready;
2. `plan_adapters` then decides which adapters each ready base replica holds: per base, the adapters with the
   most expected requests (the larger of the short and long request rates, kept while a request within their
   load time + a tick + `window_s` is at least `p_release` likely) take its replicas' slots, so an adapter
   whose traffic is coming is loaded before its next request, ahead by at least its load time; one not held
   goes into a free slot, or replaces the least valuable ready adapter of a full replica when worth
   `prefetch_margin` times more. An adapter a router waits on (`snapshot.waiting`) goes first and may replace
   any ready one. A replica takes at most ADAPTER_LOADS_PER_REPLICA planned adapter loads at once;
3. slots (PolicyConfig.adapter_slot_replicas, on by default): when a base's working set (those adapters) is
   more than its replicas' slots hold, one more replica of the base is started per call on a GPU with room
   and a free load slot (never by evicting: the memory is free, and step 1's values decide evictions),
   `kind = "adapter_slots"`. It costs engine starts no request waits on, for adapter cold starts avoided.
An adapter is never planned onto a GPU without a ready replica of its base (one this call evicts does not
count), and is never a model of its own to step 1 (no engine start for it, no fill, no eviction to make room).

Pure: no I/O, no clock; deterministic for (snapshot, now, state). The live scheduler and the simulator both
call `plan_with_adapters`; with no adapter in the catalog it is `plan()`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from prewarm.domain.action_kinds import ADAPTER, ADAPTER_SLOTS, DEMAND, MAKE_ROOM
from prewarm.domain.states import EVICTING, HOLDING, IN_FLIGHT, READY

from .placement import Room, rank
from .planner import PolicyState, plan
from .types import Action, Evict, ModelSpec, Preload, ReplicaState, Snapshot
from .value import load_seconds
from .words import fmt_s

ADAPTER_LOADS_PER_REPLICA = 2  # planned adapter loads in flight per base replica: the engine loads them one by one

# plan_with_adapters' split of the last catalog mapping it saw (held, so its id cannot be reused): the catalog
# without adapters must be the same object call after call, or plan()'s memo would rebuild every timeline
_split_of: list[Any] = [None, None, None]


def is_adapter(spec: ModelSpec) -> bool:
    return spec.base is not None


def traffic_keys(model: str, base: str | None) -> tuple[str, ...]:
    """The traffic keys a request for `model` counts under: its own, and an adapter's base's too (`base`: the
    catalog's base of the model, None for a whole model). The one rule that makes a base's value count its
    adapters' traffic: the simulator and the live scheduler feed the history through it."""
    return (model,) if base is None else (model, base)


def split(models: Mapping[str, ModelSpec]) -> tuple[Mapping[str, ModelSpec], dict[str, ModelSpec]] | None:
    """(the catalog without its adapters, its adapters), or None when it has none."""
    if _split_of[0] is models:
        return (_split_of[1], _split_of[2]) if _split_of[2] else None
    adapters = {m: s for m, s in models.items() if s.base is not None}
    whole = {m: s for m, s in models.items() if s.base is None} if adapters else models
    _split_of[:] = [models, whole, adapters]
    return (whole, adapters) if adapters else None


def plan_with_adapters(snapshot: Snapshot, now: float, state: PolicyState | None = None) -> list[Action]:
    """plan() for a catalog with LoRA adapters: the bases and whole models by plan(), then the adapters'
    slots (plan_adapters). See the module docstring."""
    parts = split(snapshot.models)
    if parts is None:
        return plan(snapshot, now, state)
    actions = plan(bases_view(snapshot), now, state)
    return actions + plan_adapters(snapshot, now, actions, parts[1])


def bases_view(snapshot: Snapshot) -> Snapshot:
    """The snapshot without its adapters (models, replicas, intents), where a request waiting on an adapter
    whose base has no ready replica waits on the base: what plan() and the live baselines plan (the
    bases, from their adapters' traffic, as any model). The same snapshot when the catalog has no adapter."""
    parts = split(snapshot.models)
    if parts is None:
        return snapshot
    whole, adapters = parts
    ready_bases = {r.model for r in snapshot.replicas if r.state == READY and r.host is None}
    waiting = {m: n for m, n in snapshot.waiting.items() if m not in adapters}
    since = {m: t for m, t in snapshot.waiting_since.items() if m not in adapters}
    for m, n in snapshot.waiting.items():
        base = adapters[m].base if m in adapters else None
        if base is None or base in ready_bases or base not in whole:
            continue  # an adapter on a ready base waits for its own load (plan_adapters), not the base's
        waiting[base] = waiting.get(base, 0) + n
        t = snapshot.waiting_since.get(m)
        if t is not None:
            since[base] = min(t, since.get(base, t))
    return dataclasses.replace(
        snapshot, models=whole,
        replicas=tuple(r for r in snapshot.replicas if r.host is None and r.model not in adapters),
        intents=tuple(i for i in snapshot.intents if i.model not in adapters),
        waiting=waiting, waiting_since=since)


def adapter_value(snapshot: Snapshot, a: str, spec: ModelSpec, now: float) -> tuple[float, float]:
    """(expected requests/s, P(a request within its load time + a tick + window_s)) of adapter a."""
    tr, cfg = snapshot.traffic, snapshot.config
    rate = max(tr.rate_short(a, now), tr.rate_long(a, now))
    horizon = load_seconds(spec, cfg) + cfg.tick_s + cfg.window_s
    return rate, -math.expm1(-rate * horizon)


def plan_adapters(snapshot: Snapshot, now: float, planned: list[Action],
                  adapters: Mapping[str, ModelSpec]) -> list[Action]:
    """The adapters each ready base replica holds (steps 2 and 3 of the module docstring), given the actions
    plan() chose for the bases (`planned`: a base replica it evicts hosts nothing; its loads take memory)."""
    cfg, models = snapshot.config, snapshot.models
    out: list[Action] = []
    evicted = {(a.model, a.gpu) for a in planned if isinstance(a, Evict)}
    hosts: dict[str, list[str]] = {}  # base -> GPUs of its ready replicas
    replicas_of: dict[str, int] = {}  # base -> replicas held or on the way (for the slots rule)
    for r in snapshot.replicas:
        spec = models.get(r.model)
        if r.host is not None or spec is None or spec.max_adapters < 1 or (r.model, r.gpu) in evicted:
            continue
        if r.state == READY:
            hosts.setdefault(r.model, []).append(r.gpu)
        if r.state in IN_FLIGHT or r.state == READY:
            replicas_of[r.model] = replicas_of.get(r.model, 0) + 1
    for a in planned:
        if isinstance(a, Preload) and a.model in models and models[a.model].max_adapters > 0:
            replicas_of[a.model] = replicas_of.get(a.model, 0) + 1
    # what each base replica holds: adapter -> its replica (None: a preload sent, not confirmed yet)
    held: dict[tuple[str, str], dict[str, ReplicaState | None]] = {}
    for r in snapshot.replicas:
        spec = adapters.get(r.model)
        if spec is not None and r.state in HOLDING:
            held.setdefault((spec.base or "", r.gpu), {})[r.model] = r
    for i in snapshot.intents:
        spec = adapters.get(i.model)
        if spec is None or i.expires_at <= now:
            continue
        slots = held.setdefault((spec.base or "", i.gpu), {})
        if i.kind == "preload":
            slots.setdefault(i.model, None)
        elif i.kind == "evict":
            slots.pop(i.model, None)
    by_base: dict[str, list[str]] = {}
    for m, spec in adapters.items():
        by_base.setdefault(spec.base or "", []).append(m)
    for base in sorted(by_base):
        bspec = models.get(base)
        if bspec is None or bspec.max_adapters < 1:
            continue
        gpus = sorted(hosts.get(base, ()))
        value: dict[str, tuple[float, float]] = {}
        work: list[tuple[float, str]] = []  # (-requests/s, adapter): the working set, most valuable first
        for m in by_base[base]:
            if m in snapshot.waiting:
                value[m] = (math.inf, 1.0)
                work.append((-math.inf, m))
                continue
            last = snapshot.traffic.last_arrival(m)
            if last is None:
                continue
            v = adapter_value(snapshot, m, adapters[m], now)
            value[m] = v
            if v[1] >= cfg.p_release:
                work.append((-v[0], m))
        work.sort()
        if gpus:
            _fill_slots(snapshot, now, base, bspec, gpus, [m for _v, m in work], value, held, out)
        need = math.ceil(len(work) / bspec.max_adapters)
        if cfg.adapter_slot_replicas and work and replicas_of.get(base, 0) < need:
            _more_slots(snapshot, now, base, bspec, len(work), replicas_of.get(base, 0), planned + out, out)
    return out


def _fill_slots(snapshot: Snapshot, now: float, base: str, bspec: ModelSpec, gpus: list[str], work: list[str],
                value: dict[str, tuple[float, float]], held: dict[tuple[str, str], dict[str, ReplicaState | None]],
                out: list[Action]) -> None:
    """Load the base's working set into its ready replicas' slots, the most valuable first."""
    cfg = snapshot.config
    slots = bspec.max_adapters
    where: dict[str, str] = {}
    loading: dict[str, int] = {}
    for g in gpus:
        for m, r in held.get((base, g), {}).items():
            where.setdefault(m, g)
            if r is None or r.state in IN_FLIGHT:
                loading[g] = loading.get(g, 0) + 1
    keep = set(work[: slots * len(gpus)])
    for m in work[: slots * len(gpus)]:
        if m in where:
            continue
        rate, p = value[m]
        demand = math.isinf(rate)
        best: tuple | None = None
        for g in gpus:
            if loading.get(g, 0) >= ADAPTER_LOADS_PER_REPLICA and not demand:
                continue
            there = held.setdefault((base, g), {})
            if len(there) < slots:
                cand: tuple = (0, len(there), g, None)
            else:
                victims = [(value.get(x, (0.0, 0.0))[0], x) for x, r in there.items()
                           if r is not None and r.state == READY and r.in_flight == 0 and x not in keep]
                if not victims:
                    continue
                vrate, victim = min(victims)
                if not demand and vrate * cfg.prefetch_margin >= rate:
                    continue
                cand = (1, vrate, g, victim)
            if best is None or cand < best:
                best = cand
        if best is None:
            continue
        _full, _n, g, victim = best
        there = held[(base, g)]
        if victim is not None:
            out.append(Evict(victim, g, MAKE_ROOM,
                             f"make a LoRA slot of {base} on {g} for {m}: {victim} expects "
                             f"{value.get(victim, (0.0, 0.0))[0] * 60:.2f} requests/min, {m} "
                             + ("has a request waiting" if demand else f"{rate * 60:.2f}"),
                             {"victim_rate": value.get(victim, (0.0, 0.0))[0], "rate": rate}))
            del there[victim]
        spec = snapshot.models[m]
        out.append(Preload(m, g, DEMAND if demand else ADAPTER,
                           (f"a request for adapter {m} is waiting; its base {base} is ready on {g}" if demand else
                            f"adapter {m}: a request within {fmt_s(load_seconds(spec, cfg) + cfg.tick_s + cfg.window_s)}"
                            f" is {p:.0%} likely ({rate * 60:.2f}/min): into a LoRA slot of {base} on {g}"),
                           {"rate": rate, "p": p}, version=spec.version, bytes=spec.size_bytes))
        there[m] = None
        where[m] = g
        loading[g] = loading.get(g, 0) + 1


def _more_slots(snapshot: Snapshot, now: float, base: str, bspec: ModelSpec, working: int, have: int,
                sent: list[Action], out: list[Action]) -> None:
    """One more replica of the base for its adapters' slots, on a GPU with room and a free load slot."""
    cfg = snapshot.config
    size = bspec.size_bytes
    taken: dict[str, int] = {}
    loads: dict[str, int] = {}
    hosting: set[str] = set()
    for r in snapshot.replicas:
        if r.model == base and r.state != EVICTING:
            hosting.add(r.gpu)
        if r.state in IN_FLIGHT and r.host is None:
            loads[r.gpu] = loads.get(r.gpu, 0) + 1
    for i in snapshot.intents:
        spec = snapshot.models.get(i.model)
        if i.kind == "preload" and i.expires_at > now and spec is not None and spec.base is None:
            taken[i.gpu] = taken.get(i.gpu, 0) + i.bytes
            loads[i.gpu] = loads.get(i.gpu, 0) + 1
    for a in sent:
        if isinstance(a, Preload) and a.model in snapshot.models and snapshot.models[a.model].base is None:
            taken[a.gpu] = taken.get(a.gpu, 0) + snapshot.models[a.model].size_bytes
            loads[a.gpu] = loads.get(a.gpu, 0) + 1
            if a.model == base:
                hosting.add(a.gpu)
    rooms = [Room(g.id, g.node, g.free_bytes - taken.get(g.id, 0), loads.get(g.id, 0))
             for g in snapshot.gpus if g.alive]
    limit = cfg.max_loads_per_gpu
    fits = [r for r in rank(rooms, size, exclude=hosting, max_loads=limit) if not (0 < limit <= r.loads)]
    if not fits:
        return
    g = fits[0].gpu
    out.append(Preload(base, g, ADAPTER_SLOTS,
                       f"{working} adapters of {base} expect requests soon; {have} replica(s) hold "
                       f"{have * bspec.max_adapters} in their LoRA slots: one more on {g}, in free memory",
                       {"working_set": float(working), "replicas": float(have), "slots": float(bspec.max_adapters)},
                       version=bspec.version, bytes=size))
