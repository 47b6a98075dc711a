"""The policies the simulator compares. Baselines are implemented as published, never tuned; their
decision rules live in `prewarm.domain.baselines` (the live scheduler runs the same ones) and run here
against the engine (`Simulation` implements their `Fleet`). Here: the oracle and prewarm's adapter.

Multi-GPU adaptation shared by the baselines (the papers describe one memory pool): a model is
loaded on a GPU with room if there is one; otherwise on the GPU whose victims — taken in the
policy's own eviction order until the model fits — reach least far into that order
(`Simulation.place_evicting`). Only ready replicas are evicted; loads in flight are never cancelled.

The host-memory staging tier (issue 4, `Simulation(host_bytes=...)`) is prewarm's: the baselines
are implemented as published and never stage, so with a host tier on their figures do not change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prewarm.domain.action_kinds import DEMAND, PREFETCH
from prewarm.domain.baselines import RULES
from prewarm.domain.choice import PrewarmPolicy
from prewarm.domain.policy import (
    Action,
    Evict,
    GpuState,
    Keep,
    ModelSpec,
    NodeState,
    PolicyConfig,
    PolicyState,
    Preload,
    ReplicaState,
    Snapshot,
    Stage,
    StagedState,
    TrafficHistory,
    Unstage,
    traffic_keys,
)
from prewarm.domain.states import READY

from .engine import Simulation
from .fleet import HostCopy, Replica
from .policy_base import _Base


class Oracle(_Base):
    """oracle: clairvoyant reference. Evicts the resident whose next request is farthest in the
    future (Belady's MIN, generalised to sizes by taking victims in that order), and starts each
    load its load time before the model's next request when room allows — room meaning free
    memory or residents whose next request comes later than this model's."""

    name = "oracle"

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self.per_model: list[list[float]] = [a.tolist() for a in sim.trace.per_model_times()]
        self.ptr = [0] * sim.n_models
        for m in range(sim.n_models):
            self._schedule(m)

    def next_use(self, m: int) -> float:
        p = self.ptr[m]
        lst = self.per_model[m]
        return lst[p] if p < len(lst) else math.inf

    def _key(self, r: Replica) -> float:
        return -self.next_use(r.model)

    def _schedule(self, m: int) -> None:
        nxt = self.next_use(m)
        if nxt < math.inf:
            self.sim.timer(max(0.0, nxt - self.sim.load_s[m]), ("prefetch", m, self.ptr[m]))

    def on_request(self, t: float, m: int, warm: bool) -> None:
        self.ptr[m] += 1
        self._schedule(m)

    def on_miss(self, t: float, m: int) -> None:
        self.sim.place_evicting(m, self._key, kind=DEMAND)

    def on_timer(self, t: float, payload: tuple) -> None:
        _tag, m, p = payload
        if p != self.ptr[m] or self.sim.replicas[m]:
            return
        nxt = self.next_use(m)
        self.sim.place_evicting(m, self._key, only_if=lambda r: self.next_use(r.model) > nxt, kind=PREFETCH)


class Prewarm(_Base):
    """prewarm: our policy — prewarm.domain.policy.plan, the same function the live scheduler runs,
    called every config.tick_s of virtual time and right away on a cold request that has no load
    in flight (as live, where a cold route lookup starts an on-demand preload and wakes the leader
    scheduler for an extra tick). The simulator plays the
    worker: Preload starts a load on the named GPU, Evict removes a ready replica or cancels a load in
    flight (a fill giving way to a demand load). With a host tier
    (host_bytes > 0) the snapshot also carries each node's cache (`nodes`) and its contents
    (`staged`); Stage starts a stage if the node has room and does not hold the model yet (else it
    is ignored), Unstage drops a completed stage."""

    name = "prewarm"

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.cfg = config or PolicyConfig()
        self.tick_s = self.cfg.tick_s

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self.history = TrafficHistory.for_config(self.cfg)
        # the live scheduler's policy object: plan() with its state, and the whole experts beside it (whole.py)
        self.policy = PrewarmPolicy(self.cfg)
        self.state: PolicyState = self.policy.state
        self.arrivals: list[tuple[str, float, int]] = []  # requests since the last call, as live reports them
        self.names = sim.trace.models
        self.index = {m: i for i, m in enumerate(self.names)}
        self.gpu_index = {g.id: g.index for g in sim.gpus}
        # LoRA adapters (issue 29): an adapter names its base, a base its slots per replica
        host = sim.ad.host if sim.ad is not None else [-1] * sim.n_models
        slots = sim.ad.max_adapters if sim.ad is not None else [0] * sim.n_models
        self.specs = {
            m: ModelSpec(m, sim.sizes[i], load_seconds=sim.load_s[i],
                         promote_seconds=sim.promote_s[i] if sim.host_on else None,
                         priority=sim.priority[i], max_replica_age_s=sim.max_replica_age[i],
                         base=self.names[host[i]] if host[i] >= 0 else None, max_adapters=slots[i])
            for i, m in enumerate(self.names)
        }
        self.adapter_rs: tuple[int, tuple[ReplicaState, ...]] = (-1, ())  # (slots version, adapter replicas)
        self.node_index = {n.id: n.index for n in sim.nodes}
        # (host_version, nodes, staged) of the last snapshot: empty while there is no host tier
        self._host: tuple[int, tuple[NodeState, ...], tuple[StagedState, ...]] = (-1, (), ())
        self.rs: dict[tuple[int, int], ReplicaState] = {}
        self.dirty: set[tuple[int, int]] = set()
        self.evicted_at: dict[str, float] = {}
        self.actions = 0
        # the instant of the last plan while nothing has been reported since (None after any report): a wake-up then
        # has nothing that plan did not see
        self.settled_at: float | None = None

    def on_request(self, t: float, m: int, warm: bool) -> None:
        self.settled_at = None
        self.history.add(self.names[m], t)
        self.arrivals.append((self.names[m], t - 0.5, 1))  # (model, second, count): t - 0.5 + 0.5 is t itself
        if warm:
            for gi, r in self.sim.replicas[m].items():
                if r.state == READY:
                    self.dirty.add((m, gi))
                    break

    def on_adapter_request(self, t: float, a: int, warm: bool) -> None:
        """A request for adapter a (the adapter view, simulator.adapters): counted for the adapter and its base
        (traffic_keys), the base's serving replica marked as the engine's own path does for a model."""
        self.settled_at = None
        name = self.names[a]
        for key in traffic_keys(name, self.specs[name].base):
            self.history.add(key, t)
        b = self.sim.ad.host[a]  # type: ignore[union-attr]
        for gi, r in self.sim.replicas[b].items():
            if r.state == READY:
                self.dirty.add((b, gi))

    def on_miss(self, t: float, m: int) -> None:
        self._plan(t)

    def on_tick(self, t: float) -> None:
        self._plan(t)

    def on_stalled(self, t: float, models: list[int]) -> None:
        # as live: a load finished while requests wait with no load. prewarm's plan sees them at the next tick (at
        # most tick_s away); a policy driven by that event (a whole expert planning) is woken for it at once. The
        # engine's retry right after a tick is no such event: that tick's plan saw all there is (live, one plan per
        # tick; planning twice there was 8 % of a replayed day's calls)
        if self.policy.wakes_on_ready() and self.settled_at != t:
            self._plan(t)

    def on_ready(self, t: float, r: Replica) -> None:
        self.settled_at = None
        self.dirty.add((r.model, r.gpu))

    def on_staged(self, t: float, c: HostCopy) -> None:
        self.settled_at = None

    def on_load_start(self, t: float, r: Replica) -> None:
        self.settled_at = None
        self.dirty.add((r.model, r.gpu))  # pending -> loading, as the worker reports it

    def _snapshot(self) -> Snapshot:
        s = self.sim
        names = self.names
        for key in self.dirty:
            m, gi = key
            r = s.replicas[m].get(gi)
            if r is None:
                self.rs.pop(key, None)
                continue
            self.rs[key] = ReplicaState(
                names[m], s.gpus[gi].id, r.state, r.bytes, r.since,
                last_request=r.last_request, ready_at=None if math.isnan(r.ready_at) else r.ready_at,
            )
        self.dirty.clear()
        gpus = tuple(
            GpuState(g.id, g.node, g.capacity, g.capacity - g.used, joined_at=-math.inf) for g in s.gpus
        )
        waiting = {names[m]: len(s.waiting[m]) for m in s.stalled}
        since = {names[m]: s.waiting[m][0] for m in s.stalled if s.waiting[m]}
        if s.host_on and self._host[0] != s.host_version:  # rebuilt only when a host cache changed
            nodes = tuple(NodeState(n.id, n.capacity, n.capacity - n.used) for n in s.nodes)
            staged = tuple(
                StagedState(names[c.model], n.id, c.state, c.bytes, c.since)
                for n in s.nodes for c in n.cached.values()
            )
            self._host = (s.host_version, nodes, staged)
        replicas = tuple(self.rs.values())
        if s.ad is not None:
            replicas += self._adapter_replicas()
        return Snapshot(self.specs, gpus, replicas, self.history,
                        recent_evictions=self.evicted_at, waiting=waiting, waiting_since=since, config=self.cfg,
                        nodes=self._host[1], staged=self._host[2])

    def _adapter_replicas(self) -> tuple[ReplicaState, ...]:
        """The adapters in their base replicas' slots, as the worker reports them (host = the base)."""
        ad = self.sim.ad
        assert ad is not None
        if self.adapter_rs[0] != ad.version:
            names, gpus = self.names, self.sim.gpus
            self.adapter_rs = (ad.version, tuple(
                ReplicaState(names[x.model], gpus[x.gpu].id, x.state, x.bytes, x.since, last_request=x.last_use,
                             ready_at=None if math.isnan(x.ready_at) else x.ready_at, host=names[x.base])
                for held in ad.slots.values() for x in held.values()))
        return self.adapter_rs[1]

    def _plan(self, t: float) -> None:
        snap = self._snapshot()
        arrivals, self.arrivals = self.arrivals, []
        self._apply(self.policy.decide(snap, t, arrivals), t)
        self.settled_at = t

    def _apply(self, actions: Iterable[Action], t: float) -> None:
        """Play the worker for plan()'s actions (an action the fleet cannot take is ignored)."""
        s = self.sim
        for a in actions:
            if isinstance(a, Keep):
                continue  # nothing to play: a decision to leave a replica as it is
            self.actions += 1
            m = self.index[a.model]
            if s.ad is not None and s.ad.host[m] >= 0 and isinstance(a, (Preload, Evict)):
                # an adapter: into / out of a LoRA slot of its base's replica on that GPU (ignored when the
                # engine cannot: no ready base there, no free slot, not held)
                gi = self.gpu_index[a.gpu]
                if isinstance(a, Preload):
                    s.ad.load(m, gi, a.kind)
                else:
                    s.ad.unload(m, gi)
                continue
            if isinstance(a, Evict):
                gi = self.gpu_index[a.gpu]
                if s.evict(m, gi) or s.cancel_load(m, gi):  # a load in flight is cancelled, as the worker does
                    self.evicted_at[a.model] = t
                    self.rs.pop((m, gi), None)
            elif isinstance(a, Preload):
                gi = self.gpu_index[a.gpu]
                if s.start_load(m, gi, a.kind) is not None:
                    self.dirty.add((m, gi))
            elif isinstance(a, Stage):
                ni = self.node_index.get(a.node)
                if ni is not None and s.host_on:
                    s.start_stage(m, ni)  # None: already held/staging or no room → ignored
            elif isinstance(a, Unstage):
                ni = self.node_index.get(a.node)
                if ni is not None:
                    s.unstage(m, ni)


POLICIES: dict[str, type] = {
    **RULES,
    "oracle": Oracle,
    "prewarm": Prewarm,
}
