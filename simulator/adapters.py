"""LoRA adapters in the simulator (issue 29, item 5): a trace whose models are adapters of a few bases.

Profile (the trace's profile CSV, two optional columns beside `model,size_bytes,load_seconds`):
- `base`: on an adapter's row, the model id of its base; empty on any other row. The base need not be in
  the trace (no request names it): its own row gives its size and load time (the engine start).
- `max_adapters`: on a base's row, the LoRA slots of each of its replicas (vLLM's `--max-loras`).
An adapter's `size_bytes` are its weights (tens of MB) and its `load_seconds` the load into a running
engine (well under a second). A profile with no `base` column, or none filled in, is a trace of whole
models: nothing here runs and no figure changes.

The model (the same for every policy: vLLM's own mechanics, implemented once, here):
- an adapter is served only by a ready replica of its base that holds it in one of its slots (a warm
  request). A base replica has `max_adapters` slots; an adapter occupies one from its load's start.
- a request for an adapter whose base has a ready replica but no replica holding it is cold and waits for
  the adapter's load only: the engine loads it at once (vLLM loads on a miss) into a ready base replica
  with a free slot, else evicts the least recently used ready adapter of the replica whose LRU adapter is
  the oldest (vLLM's LRU). A request for an adapter already loading waits for that load.
- a request for an adapter whose base has no ready replica is cold and waits for the base: the policy
  sees it as a request (and a miss) for the base, as it sees any model's; when a base replica turns ready
  the adapters its waiting requests named load into it, and those requests wait for that too.
- adapter loads take their own `load_seconds` and do not share the GPU's load link or slots (tens of MB
  beside tens of GB), and their bytes are not GPU memory here: vLLM allocates the slots' memory when the
  engine starts (max_loras × max_lora_rank), inside the base's measured size. vLLM's CPU cache of adapters
  (`--max-cpu-loras`) is not modelled: every adapter load reads from storage.
- evicting a base replica unloads its adapters; requests waiting on one of them wait again (on another
  ready replica of the base, or on the base).
- the policies see the bases' traffic (`trace` is the bases' view: each adapter request is one for its
  base, `on_request(t, base, warm)`, warm when a base replica was ready) and plan bases as they plan any
  model; a policy with an `on_adapter_request(t, a, warm)` hook gets that instead (prewarm: it counts the
  request for the adapter and its base, and plans adapters through `load` / `unload`).

Figures (Simulation.results()["adapters"]): engine starts (base loads), cold requests that waited on a
base start (`cold_engine`) or on an adapter load only (`cold_adapter`), adapter loads and evictions, and
the waits of each kind; `adapter_wait_over_load_max` is the most an adapter-only cold request waited
beyond its adapter's load time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from prewarm.domain.action_kinds import AHEAD_OF_DEMAND, DEMAND
from prewarm.domain.states import LOADING, READY

from .trace import Profile, ProfileError, Trace, profile_number, profile_rows, profile_size

# the engine's event kind for an adapter load's end: after loads and stages, before timers and ticks at one instant
ADAPTER_DONE = 2

Waiter = tuple[float, bool]  # (arrival, whether it waited on a base start first)


@dataclass(slots=True)
class AdapterView:
    """The adapters of a trace: per model index of the extended model list (the trace's models, then the
    bases no request names), the index of its base (-1: not an adapter) and, for a base, its slots per
    replica (0: not a base). `amids`: per request, the model it named (the trace's own mids)."""

    host: list[int]
    max_adapters: list[int]
    amids: np.ndarray


def read_adapter_columns(path: str | Path | Profile | None) -> dict[str, tuple[str, int, int, float]] | None:
    """The profile's rows as model -> (base, max_adapters, size_bytes, load_seconds), or None when the
    profile says nothing of adapters (no `base` column, or none filled in)."""
    if path is None:
        return None
    rows: dict[str, tuple[str, int, int, float]] = {}
    read = profile_rows(path)
    if not read or "base" not in read[0][1]:  # no base column (each row has every column of the header)
        return None
    for line, row in read:
        slots = (row.get("max_adapters") or "").strip()
        if slots and not slots.isdigit():
            raise ProfileError(f"profile {path}: line {line}: model {row['model']!r}: max_adapters {slots!r} is not a "
                               "whole number of 0 or more")
        rows[row["model"]] = ((row.get("base") or "").strip(), int(slots) if slots else 0,
                              profile_size(path, line, row),
                              profile_number(path, line, row, "load_seconds"))
    if not any(base for base, *_ in rows.values()):
        return None
    return rows


def adapter_view(trace: Trace, profile: str | Path | Profile | None, sizes: np.ndarray, loads: np.ndarray,
                 priority: list[int], ages: list[float | None]
                 ) -> tuple[Trace, np.ndarray, np.ndarray, list[int], list[float | None], AdapterView] | None:
    """The bases' view of an adapter trace: its models plus the bases no request names (sizes, load times
    and catalog fields extended to them), each request counted for its base; and the AdapterView. None
    when the profile has no adapters (the trace is simulated as it is)."""
    rows = read_adapter_columns(profile)
    if rows is None:
        return None
    models = list(trace.models)
    index = {m: i for i, m in enumerate(models)}
    bases: list[str] = []
    for m in models:
        base = rows.get(m, ("", 0, 0, 0.0))[0]
        if not base:
            continue
        if base not in rows:
            raise ValueError(f"profile {profile}: adapter {m!r}: its base {base!r} has no row")
        if rows[base][0]:
            raise ValueError(f"profile {profile}: adapter {m!r}: its base {base!r} is an adapter itself")
        if rows[base][1] < 1:
            raise ValueError(f"profile {profile}: base {base!r} needs max_adapters >= 1 (its LoRA slots)")
        if base not in index:
            index[base] = len(models)
            models.append(base)
            bases.append(base)
    n = len(models)
    host = [-1] * n
    slots = [0] * n
    for i, m in enumerate(trace.models):
        base = rows.get(m, ("", 0, 0, 0.0))[0]
        if base:
            host[i] = index[base]
    for i in set(h for h in host if h >= 0):
        slots[i] = rows[models[i]][1]
    extra = len(bases)
    sizes = np.concatenate([sizes, np.array([rows[b][2] for b in bases], dtype=np.int64)])
    loads = np.concatenate([loads, np.array([rows[b][3] for b in bases], dtype=np.float64)])
    amids = trace.mids
    hosts = np.array(host, dtype=np.int32)
    mids = np.where(hosts[amids] >= 0, hosts[amids], amids).astype(np.int32)
    view = Trace(models, trace.times, mids, trace.span_s, trace.source, trace.fmt)
    return (view, sizes, loads, [*priority, *([1] * extra)], [*ages, *([None] * extra)],
            AdapterView(host, slots, amids))


@dataclass(eq=False, slots=True)
class Slot:
    """One adapter in one LoRA slot of one base replica."""

    model: int
    base: int
    gpu: int
    bytes: int
    since: float  # load start
    state: str = LOADING  # LOADING or READY (prewarm.domain.states)
    ready_at: float = math.nan
    last_use: float | None = None  # last request it served (the LRU clock; else its load start)
    kind: str = ""  # "demand" (the engine's load on a miss) or the policy's Preload kind
    waiters: list[Waiter] = field(default_factory=list)
    gone: bool = False  # unloaded (its completion event, if any, is stale)


class ReplicaView(Protocol):
    """What AdapterSlots reads and writes of a base's replica (simulator.fleet.Replica): a Protocol, not an
    import, as engine imports this module. Annotations only: the engine's own objects are passed."""

    @property
    def model(self) -> int: ...

    @property
    def gpu(self) -> int: ...

    @property
    def state(self) -> str: ...

    last_request: float | None


class SimulationView(Protocol):
    """What AdapterSlots reads and writes of its simulator.engine.Simulation (a Protocol for the same reason
    as ReplicaView). Read-only members are properties, so the engine's plain lists and dicts match them."""

    now: float
    cold: int
    avoided: int

    @property
    def trace(self) -> Trace: ...

    @property
    def policy(self) -> object: ...

    @property
    def events(self) -> list[tuple[float, int, int, tuple]]: ...

    @property
    def replicas(self) -> Sequence[Mapping[int, ReplicaView]]: ...

    @property
    def ready_count(self) -> list[int]: ...

    @property
    def waiting(self) -> list[list[float]]: ...

    @property
    def stalled(self) -> dict[int, None]: ...

    @property
    def last_arrival(self) -> list[float | None]: ...

    @property
    def req_per_model(self) -> list[int]: ...

    @property
    def cold_per_model(self) -> list[int]: ...

    @property
    def loads_per_model(self) -> list[int]: ...

    @property
    def waits(self) -> list[float]: ...

    @property
    def sizes(self) -> list[int]: ...

    @property
    def load_s(self) -> list[float]: ...

    def push(self, t: float, kind: int, payload: tuple) -> None: ...

    def serve(self, t: float, m: int, policy: Any) -> None: ...

    def _dispatch(self, ev: tuple[float, int, int, tuple], end: float) -> None: ...


class AdapterSlots:
    """The slots of every base replica of one Simulation, and the adapter requests' path through them."""

    def __init__(self, sim: SimulationView, view: AdapterView) -> None:
        self.sim = sim
        self.host = view.host
        self.max_adapters = view.max_adapters
        self.amids = view.amids
        n = len(view.host)
        self.slots: dict[tuple[int, int], dict[int, Slot]] = {}  # (base, gpu) -> adapter -> slot
        self.where: list[dict[int, Slot]] = [{} for _ in range(n)]  # adapter -> gpu -> slot
        self.base_waiters: list[list[tuple[float, int]]] = [[] for _ in range(n)]  # base -> (arrival, adapter)
        self.pending: list[list[tuple[int, Waiter]]] = [[] for _ in range(n)]  # base -> no slot could be freed
        self.version = 0  # bumped on every slot change (the prewarm adapter's snapshot cache)
        self.hook: Callable[[float, int, bool], None] | None = None
        # figures
        self.requests = 0
        self.cold_engine = 0
        self.cold_adapter = 0
        self.starts_waited = 0  # base starts a request waited for (the rest were started ahead of any)
        self.loads = 0
        self.loads_ahead = 0  # loads a policy planned (not the engine's on a miss)
        self.bytes_loaded = 0
        self.evictions = 0  # adapters unloaded to free a slot (by the engine's LRU or a policy)
        self.unloaded_with_base = 0
        self.engine_waits: list[float] = []
        self.adapter_waits: list[float] = []
        self.over_load = 0.0  # the most an adapter-only cold request waited beyond its adapter's load time

    # ---- the request path -----------------------------------------------------------------
    def feed(self, policy: Any, end: float) -> None:
        """The engine's request loop for an adapter trace (Simulation.run): each request is served by its
        model's slots path (an adapter) or as in the engine's own loop (a whole model)."""
        sim = self.sim
        self.hook = getattr(policy, "on_adapter_request", None)
        events = sim.events
        host = self.host
        for t, m, a in zip(sim.trace.times.tolist(), sim.trace.mids.tolist(), self.amids.tolist(), strict=True):
            while events and events[0][0] <= t:
                sim._dispatch(heapq.heappop(events), end)
            sim.now = t
            sim.last_arrival[m] = t
            sim.req_per_model[a] += 1
            if host[a] < 0:
                sim.serve(t, m, policy)  # a whole model: the engine's own path
                continue
            self.requests += 1
            sim.last_arrival[a] = t
            served = self.request(t, a, m)
            if served is None:  # no ready base replica: cold, waiting on the base's start
                sim.cold += 1
                sim.cold_per_model[a] += 1
                self.cold_engine += 1
                sim.waiting[m].append(t)
                self.base_waiters[m].append((t, a))
                if self.hook is not None:
                    self.hook(t, a, False)
                else:
                    policy.on_request(t, m, False)
                if not sim.replicas[m]:
                    sim.stalled[m] = None
                    policy.on_miss(t, m)
                continue
            if not served:
                sim.cold += 1
                sim.cold_per_model[a] += 1
                self.cold_adapter += 1
            if self.hook is not None:
                self.hook(t, a, served)
            else:
                policy.on_request(t, m, True)  # the base served it (or loads its adapter): warm for the base

    def request(self, t: float, a: int, b: int) -> bool | None:
        """Serve a request for adapter a (base b) arriving now: True warm, False cold on the adapter's load
        only (started or joined here), None when no replica of b is ready (the caller waits on the base)."""
        sim = self.sim
        if not sim.ready_count[b]:
            return None
        for gi, s in self.where[a].items():
            if s.state == READY:
                s.last_use = t
                sim.replicas[b][gi].last_request = t
                sim.avoided += s.kind in AHEAD_OF_DEMAND  # an adapter warmed ahead (the ROI's list, as live)
                return True
        self._route(t, a, b, (t, False))
        return False

    def _route(self, now: float, a: int, b: int, w: Waiter) -> None:
        """A cold request for adapter a on a fleet with a ready replica of b: served now by a ready copy,
        joins a load in flight, or starts the engine's on-demand load (LRU in the slots)."""
        loading = None
        for gi, s in self.where[a].items():
            if s.state == READY:
                self._served(now, s, w)
                self.sim.replicas[b][gi].last_request = now
                return
            loading = s
        if loading is not None:
            loading.waiters.append(w)
            return
        target = self._lru_replica(b)
        if target is None:  # every slot of every ready replica is loading: retry when one of them ends
            self.pending[b].append((a, w))
            return
        started = self.load(a, target, DEMAND, lru=True)
        assert started is not None
        started.waiters.append(w)

    def _lru_replica(self, b: int) -> int | None:
        """The ready replica of b an on-demand load goes to: one with a free slot (the fewest taken), else the
        one whose least recently used ready adapter is the oldest; None when no slot can be freed."""
        best: tuple | None = None
        cap = self.max_adapters[b]
        for gi, r in self.sim.replicas[b].items():
            if r.state != READY:
                continue
            held = self.slots.get((b, gi), {})
            if len(held) < cap:
                key: tuple = (0, len(held), gi)
            else:
                old = [_lru(s) for s in held.values() if s.state == READY]
                if not old:
                    continue
                key = (1, min(old), gi)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]

    def _served(self, now: float, s: Slot, w: Waiter) -> None:
        arrived, via_engine = w
        wait = now - arrived
        self.sim.waits.append(wait)
        s.last_use = now
        if via_engine:
            self.engine_waits.append(wait)
        else:
            self.adapter_waits.append(wait)
            self.over_load = max(self.over_load, wait - self.sim.load_s[s.model])

    # ---- slots: loads and unloads (the engine's, and a policy's through these) -----------------
    def load(self, a: int, gi: int, kind: str, lru: bool = False) -> Slot | None:
        """Start loading adapter a into the ready replica of its base on GPU gi. None (nothing done) when
        there is none, it holds a already, or its slots are full (`lru`: evict its least recently used
        ready adapter first, as vLLM does on a miss)."""
        sim = self.sim
        b = self.host[a]
        r = sim.replicas[b].get(gi) if b >= 0 else None
        if r is None or r.state != READY or gi in self.where[a]:
            return None
        held = self.slots.setdefault((b, gi), {})
        if len(held) >= self.max_adapters[b]:
            victims = [s for s in held.values() if s.state == READY]
            if not lru or not victims:
                return None
            v = min(victims, key=lambda s: (_lru(s), s.model))
            self.unload(v.model, gi)
        t = sim.now
        s = Slot(a, b, gi, sim.sizes[a], t, kind=kind)
        held[a] = s
        self.where[a][gi] = s
        self.loads += 1
        self.loads_ahead += kind != DEMAND
        self.bytes_loaded += s.bytes
        self.version += 1
        sim.push(t + sim.load_s[a], ADAPTER_DONE, (s,))
        return s

    def unload(self, a: int, gi: int) -> bool:
        """Unload a ready adapter from its slot on GPU gi (a loading one is not cancelled, as a replica's)."""
        s = self.where[a].get(gi)
        if s is None or s.state != READY:
            return False
        self._drop(s)
        self.evictions += 1
        return True

    def _drop(self, s: Slot) -> None:
        s.gone = True
        del self.slots[(s.base, s.gpu)][s.model]
        del self.where[s.model][s.gpu]
        self.version += 1

    def done(self, now: float, s: Slot) -> None:
        """An adapter's load ended: its waiting requests are served; requests that found no slot retry."""
        if s.gone:
            return
        s.state = READY
        s.ready_at = now
        self.version += 1
        waiters, s.waiters = s.waiters, []
        for w in waiters:
            self._served(now, s, w)
        if waiters:
            self.sim.replicas[s.base][s.gpu].last_request = now
        retry, self.pending[s.base] = self.pending[s.base], []
        for a, w in retry:
            self._route(now, a, s.base, w)
        hook = getattr(self.sim.policy, "on_adapter_ready", None)
        if hook is not None:
            hook(now, s)

    # ---- bases --------------------------------------------------------------------------------
    def base_ready(self, now: float, r: ReplicaView) -> None:
        """A replica of a base turned ready: the adapters its waiting requests named load into it (the
        engine's on-demand loads), and those requests are served when they are in."""
        b = r.model
        waiters, self.base_waiters[b] = self.base_waiters[b], []
        self.starts_waited += bool(waiters)
        for arrived, a in waiters:
            self._route(now, a, b, (arrived, True))

    def base_evicted(self, r: ReplicaView) -> None:
        """A base replica was evicted: its adapters go with its engine; their waiting requests wait again."""
        b = r.model
        held = self.slots.pop((b, r.gpu), {})
        again: list[tuple[int, Waiter]] = []
        for s in held.values():
            s.gone = True
            del self.where[s.model][s.gpu]
            self.unloaded_with_base += 1
            again.extend((s.model, w) for w in s.waiters)
        if held:
            self.version += 1
        sim = self.sim
        for a, w in again:
            if sim.ready_count[b]:
                self._route(sim.now, a, b, w)
            else:  # no ready replica left: the request waits on the base again
                sim.waiting[b].append(w[0])
                self.base_waiters[b].append((w[0], a))
                if not sim.replicas[b]:
                    sim.stalled[b] = None

    # ---- results ------------------------------------------------------------------------------
    def results(self) -> dict:
        sim = self.sim
        bases = [i for i, k in enumerate(self.max_adapters) if k]
        ew = np.array(self.engine_waits) if self.engine_waits else np.zeros(1)
        aw = np.array(self.adapter_waits) if self.adapter_waits else np.zeros(1)
        return {
            "bases": len(bases),
            "adapters": sum(1 for h in self.host if h >= 0),
            "adapter_requests": self.requests,
            "engine_starts": sum(sim.loads_per_model[b] for b in bases),
            "engine_starts_waited": self.starts_waited,
            "cold_engine": self.cold_engine,
            "cold_adapter": self.cold_adapter,
            "adapter_loads": self.loads,
            "adapter_loads_ahead": self.loads_ahead,
            "adapter_bytes_loaded": self.bytes_loaded,
            "adapter_evictions": self.evictions,
            "adapters_unloaded_with_base": self.unloaded_with_base,
            "engine_wait_seconds": {"total": float(np.sum(self.engine_waits)), "p50": float(np.percentile(ew, 50)),
                                    "p99": float(np.percentile(ew, 99))},
            "adapter_wait_seconds": {"total": float(np.sum(self.adapter_waits)), "p50": float(np.percentile(aw, 50)),
                                     "p99": float(np.percentile(aw, 99)), "max": float(aw.max())},
            "adapter_wait_over_load_max": self.over_load,
        }


def _lru(s: Slot) -> float:
    return s.last_use if s.last_use is not None else s.since
