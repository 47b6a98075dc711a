"""The policies the simulator compares. Baselines are implemented as published, never tuned.

Multi-GPU adaptation shared by the baselines (the papers describe one memory pool): a model is
loaded on a GPU with room if there is one; otherwise on the GPU whose victims — taken in the
policy's own eviction order until the model fits — reach least far into that order
(`Simulation.place_evicting`). Only ready replicas are evicted; loads in flight are never cancelled.

The host-memory staging tier (issue 4, `Simulation(host_bytes=...)`) is prewarm's: the baselines
are implemented as published and never stage, so with a host tier on their figures do not change.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

from scheduler.policy import (
    Action,
    Evict,
    GpuState,
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
    plan,
)

from .engine import Replica, Simulation
from .forecast import Forecast
from .policy_base import _Base


class OnDemandLRU(_Base):
    """on-demand-lru: load on the first request (a miss), keep the model until memory is needed,
    then evict the least recently used (classic LRU caching; the default of most model servers).
    Recency = the replica's last request, or its load start if it never served one."""

    name = "on-demand-lru"

    def _key(self, r: Replica) -> float:
        return r.last_request if r.last_request is not None else r.since

    def on_miss(self, t: float, m: int) -> None:
        self.sim.place_evicting(m, self._key, kind="demand")


class KeepAlive(OnDemandLRU):
    """keepalive-10m: on-demand LRU plus a fixed keep-alive: a model idle for 10 minutes is
    unloaded (the fixed keep-alive of AWS Lambda / Azure Functions, as described in Shahrad et al.,
    ATC 2020, section 2, and Fuerst & Sharma, ASPLOS 2021)."""

    name = "keepalive-10m"
    keepalive_s = 600.0

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self.pending: set[int] = set()

    def _arm(self, t: float, m: int) -> None:
        if m not in self.pending:
            self.pending.add(m)
            self.sim.timer(t + self.keepalive_s, ("ka", m))

    def on_request(self, t: float, m: int, warm: bool) -> None:
        if warm:
            self._arm(t, m)

    def on_ready(self, t: float, r: Replica) -> None:
        self._arm(t, r.model)

    def on_timer(self, t: float, payload: tuple) -> None:
        _tag, m = payload
        self.pending.discard(m)
        for gi, r in list(self.sim.replicas[m].items()):
            if r.state != "ready":
                continue
            last = self._key(r)
            if t - last >= self.keepalive_s - 1e-9:
                self.sim.evict(m, gi)
            else:
                self._arm(last, m)


class SeedPool(_Base):
    """seed-pool: the preload pool of prewarm's original design sketch — preload a model the first
    time it is seen (its first request, here: the trace gives nothing earlier), keep a pool under
    the memory cap, and evict the oldest-loaded model (FIFO by load start, not by last use)."""

    name = "seed-pool"

    def on_miss(self, t: float, m: int) -> None:
        self.sim.place_evicting(m, lambda r: r.since, kind="demand")


class FaasCache(_Base):
    """faascache: Fuerst & Sharma, "FaasCache: Keeping Serverless Computing Alive with Greedy-Dual
    Caching", ASPLOS 2021 — Greedy-Dual keep-alive. Each resident function has
    priority = clock + frequency × cost / size, recomputed on every invocation; frequency counts
    the function's invocations while it is resident (reset when it is evicted); cost = its cold-start
    (load) time; size = its memory. When space is needed the lowest priority is evicted and the clock
    becomes the priority of the last evicted function."""

    name = "faascache"

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self.clock = 0.0
        self.freq = [0] * sim.n_models
        self.prio: dict[tuple[int, int], float] = {}

    def _set(self, m: int, gi: int) -> None:
        s = self.sim
        self.prio[(m, gi)] = self.clock + self.freq[m] * s.load_s[m] / (s.sizes[m] / (1 << 30))

    def on_request(self, t: float, m: int, warm: bool) -> None:
        self.freq[m] += 1
        for gi in self.sim.replicas[m]:
            self._set(m, gi)

    def on_miss(self, t: float, m: int) -> None:
        s = self.sim

        def key(r: Replica) -> float:
            return self.prio.get((r.model, r.gpu), self.clock)

        before = {(r.model, r.gpu) for g in s.gpus for r in g.residents.values()}
        rep = s.place_evicting(m, key, kind="demand")
        if rep is None:
            return
        gone = before - {(r.model, r.gpu) for g in s.gpus for r in g.residents.values()}
        if gone:
            self.clock = max(self.clock, max(self.prio.get(k, self.clock) for k in gone))
            for k in gone:
                self.prio.pop(k, None)
                if not s.replicas[k[0]]:
                    self.freq[k[0]] = 0
        self._set(m, rep.gpu)


class HybridHistogram(_Base):
    """hybrid-histogram: Shahrad et al., "Serverless in the Wild", USENIX ATC 2020, section 4.
    Per function an idle-time histogram (1-minute bins over 4 hours). After each invocation:
    - not representative (fewer than 5 idle times, or coefficient of variation of the bin counts
      below 2) → no pre-warm, keep-alive 4 hours;
    - out-of-bounds idle times (≥ 4 h) are ≥ 50 % of all → predict the next idle time and keep the
      function loaded from 0.85× to 1.15× of it (the paper uses ARIMA; here the documented simpler
      forecaster is the mean of the last 5 idle times);
    - else pre-warm window = 0.9 × 5th percentile ("head" with a 10 % margin), keep-alive =
      1.1 × 99th percentile minus the pre-warm window ("tail" with a 10 % margin): if the pre-warm
      window is non-zero the function is unloaded after the invocation and loaded again when the
      window ends, then kept for the keep-alive; otherwise kept loaded for the keep-alive.
    Loads and reloads evict least recently used functions when memory runs out."""

    name = "hybrid-histogram"
    bins = 240
    bin_s = 60.0

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        n = sim.n_models
        self.hist = [[0] * self.bins for _ in range(n)]
        self.n_in = [0] * n
        self.sumsq = [0] * n  # sum of squared bin counts: the CV without a pass over the bins
        self.oob = [0] * n
        self.last: list[float | None] = [None] * n
        self.recent_idle: list[deque[float]] = [deque(maxlen=5) for _ in range(n)]
        self.gen = [0] * n  # invalidates pre-warm timers of older invocations
        self.unload_at: list[float] = [math.inf] * n
        self.unload_pending = [False] * n  # one keep-alive timer per model, re-armed lazily

    def _key(self, r: Replica) -> float:
        return r.last_request if r.last_request is not None else r.since

    def windows(self, m: int) -> tuple[float, float]:
        """(pre-warm window, keep-alive window) in seconds after the invocation."""
        n_in = self.n_in[m]
        total = n_in + self.oob[m]
        if total < 5:
            return 0.0, 4 * 3600.0
        if self.oob[m] / total >= 0.5:
            pred = sum(self.recent_idle[m]) / len(self.recent_idle[m])
            return 0.85 * pred, 0.3 * pred
        mean = n_in / self.bins
        var = self.sumsq[m] / self.bins - mean * mean
        cv = math.sqrt(max(var, 0.0)) / mean if mean > 0 else 0.0
        if cv < 2.0:
            return 0.0, 4 * 3600.0
        h = self.hist[m]
        head_bin = tail_bin = -1
        cum = 0
        for i, c in enumerate(h):
            cum += c
            if head_bin < 0 and cum >= 0.05 * n_in:
                head_bin = i
            if cum >= 0.99 * n_in:
                tail_bin = i
                break
        head = head_bin * self.bin_s  # lower edge of the 5th-percentile bin
        tail = (tail_bin + 1) * self.bin_s  # upper edge of the 99th-percentile bin
        prewarm = 0.9 * head
        return prewarm, 1.1 * tail - prewarm

    def on_request(self, t: float, m: int, warm: bool) -> None:
        last = self.last[m]
        if last is not None:
            idle = t - last
            b = int(idle // self.bin_s)
            if b < self.bins:
                c = self.hist[m][b]
                self.hist[m][b] = c + 1
                self.n_in[m] += 1
                self.sumsq[m] += 2 * c + 1
            else:
                self.oob[m] += 1
            self.recent_idle[m].append(idle)
        self.last[m] = t
        self.gen[m] += 1
        pw, ka = self.windows(m)
        g = self.gen[m]
        if pw > 0:
            # unload after this invocation (it takes no time here); if it is still loading, the
            # unload happens when it becomes ready (on_ready checks unload_at)
            self.unload_at[m] = t
            for gi, r in list(self.sim.replicas[m].items()):
                if r.state == "ready":
                    self.sim.evict(m, gi)
            self.sim.timer(t + pw, ("load", m, g, ka))
        else:
            self._keep_until(m, t + ka)

    def _keep_until(self, m: int, until: float) -> None:
        self.unload_at[m] = until
        if not self.unload_pending[m]:
            self.unload_pending[m] = True
            self.sim.timer(until, ("unload", m))

    def on_ready(self, t: float, r: Replica) -> None:
        if t >= self.unload_at[r.model]:
            # the invocation that asked for an unload ran on this load (it had to wait for it)
            self.sim.evict(r.model, r.gpu)

    def on_miss(self, t: float, m: int) -> None:
        self.sim.place_evicting(m, self._key, kind="demand")

    def on_timer(self, t: float, payload: tuple) -> None:
        if payload[0] == "load":
            _tag, m, g, ka = payload
            if g != self.gen[m]:
                return
            if not self.sim.replicas[m]:
                self.sim.place_evicting(m, self._key, kind="prewarm")
            self._keep_until(m, t + ka)
        else:
            _tag, m = payload
            self.unload_pending[m] = False
            if self.unload_at[m] > t:  # a later invocation extended the keep-alive
                self._keep_until(m, self.unload_at[m])
                return
            for gi, r in list(self.sim.replicas[m].items()):
                if r.state == "ready":
                    self.sim.evict(m, gi)


class Oracle(_Base):
    """oracle: clairvoyant reference. Evicts the resident whose next request is farthest in the
    future (Belady's MIN, generalised to sizes by taking victims in that order), and starts each
    load its load time before the model's next request when room allows — room meaning free
    memory or residents whose next request comes later than this model's."""

    name = "oracle"

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        times = sim.trace.times
        mids = sim.trace.mids
        order = np.argsort(mids, kind="stable")
        self.per_model: list[list[float]] = [[] for _ in range(sim.n_models)]
        bounds = np.searchsorted(mids[order], np.arange(sim.n_models + 1))
        st = times[order]
        for m in range(sim.n_models):
            self.per_model[m] = st[bounds[m]:bounds[m + 1]].tolist()
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
        self.sim.place_evicting(m, self._key, kind="demand")

    def on_timer(self, t: float, payload: tuple) -> None:
        _tag, m, p = payload
        if p != self.ptr[m] or self.sim.replicas[m]:
            return
        nxt = self.next_use(m)
        self.sim.place_evicting(m, self._key, only_if=lambda r: self.next_use(r.model) > nxt, kind="prefetch")


class Prewarm(_Base):
    """prewarm: our policy — scheduler.policy.plan, the same function the live scheduler runs,
    called every config.tick_s of virtual time and right away on a cold request that has no load
    in flight (as live, where a cold route lookup starts an on-demand preload and wakes the leader
    scheduler for an extra tick). The simulator plays the
    worker: Preload starts a load on the named GPU, Evict removes a ready replica. With a host tier
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
        self.state = PolicyState()
        self.names = sim.trace.models
        self.index = {m: i for i, m in enumerate(self.names)}
        self.gpu_index = {g.id: g.index for g in sim.gpus}
        self.specs = {
            m: ModelSpec(m, sim.sizes[i], load_seconds=sim.load_s[i],
                         promote_seconds=sim.promote_s[i] if sim.host_on else None)
            for i, m in enumerate(self.names)
        }
        self.node_index = {n.id: n.index for n in sim.nodes}
        # (host_version, nodes, staged) of the last snapshot: empty while there is no host tier
        self._host: tuple[int, tuple[NodeState, ...], tuple[StagedState, ...]] = (-1, (), ())
        self.rs: dict[tuple[int, int], ReplicaState] = {}
        self.dirty: set[tuple[int, int]] = set()
        self.evicted_at: dict[str, float] = {}
        self.actions = 0

    def on_request(self, t: float, m: int, warm: bool) -> None:
        self.history.add(self.names[m], t)
        if warm:
            for gi, r in self.sim.replicas[m].items():
                if r.state == "ready":
                    self.dirty.add((m, gi))
                    break

    def on_miss(self, t: float, m: int) -> None:
        self._plan(t)

    def on_tick(self, t: float) -> None:
        self._plan(t)

    def on_stalled(self, t: float, models: list[int]) -> None:
        pass  # as live: the next tick (at most tick_s away) sees the waiting models

    def on_ready(self, t: float, r: Replica) -> None:
        self.dirty.add((r.model, r.gpu))

    def on_load_start(self, t: float, r: Replica) -> None:
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
                last_request=r.last_request,
            )
        self.dirty.clear()
        gpus = tuple(
            GpuState(g.id, g.node, g.capacity, g.capacity - g.used, joined_at=-math.inf) for g in s.gpus
        )
        waiting = {names[m]: len(s.waiting[m]) for m in s.stalled}
        if s.host_on and self._host[0] != s.host_version:  # rebuilt only when a host cache changed
            nodes = tuple(NodeState(n.id, n.capacity, n.capacity - n.used) for n in s.nodes)
            staged = tuple(
                StagedState(names[c.model], n.id, c.state, c.bytes, c.since)
                for n in s.nodes for c in n.cached.values()
            )
            self._host = (s.host_version, nodes, staged)
        return Snapshot(self.specs, gpus, tuple(self.rs.values()), self.history,
                        recent_evictions=self.evicted_at, waiting=waiting, config=self.cfg,
                        nodes=self._host[1], staged=self._host[2])

    def _plan(self, t: float) -> None:
        self._apply(plan(self._snapshot(), t, self.state), t)

    def _apply(self, actions: Iterable[Action], t: float) -> None:
        """Play the worker for plan()'s actions (an action the fleet cannot take is ignored)."""
        s = self.sim
        for a in actions:
            self.actions += 1
            m = self.index[a.model]
            if isinstance(a, Evict):
                gi = self.gpu_index[a.gpu]
                if s.evict(m, gi):
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


POLICIES = {
    "on-demand-lru": OnDemandLRU,
    "keepalive-10m": KeepAlive,
    "hybrid-histogram": HybridHistogram,
    "faascache": FaasCache,
    "seed-pool": SeedPool,
    "forecast": Forecast,
    "oracle": Oracle,
    "prewarm": Prewarm,
}
