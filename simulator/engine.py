"""Discrete-event trace replay with a virtual clock.

Fleet model (issue 6):
- A load occupies the model's size on its GPU from the moment it starts. Alone on its GPU it takes
  the model's load time; k loads running at once on one GPU each progress at 1/k speed (they share
  one host-to-device link). `contention="none"`: loads never slow each other.
- A request for a model with a ready replica is warm. Otherwise it is a cold start and waits until a
  replica is ready: the rest of a load in flight, or a new on-demand load that the policy places.
  Requests take no GPU time (the question is residency, not throughput).
- Eviction is instant and only of ready replicas.

Load slots (issue 12; `load_slots`, default 2 = the worker's PREWARM_MAX_LOADS_PER_GPU): the engine
models the worker, not the policy, so every policy's loads go through them. A GPU runs at most
`load_slots` loads at once (those share its link as above); a load sent to a GPU whose slots are
busy reserves its memory at once (the worker's `pending` replica) and waits FIFO for a slot; its
load time starts when it gets one. `load_slots=0`: every load starts at once (the model before
issue 12, kept for reference).

Host-memory staging tier (issue 4; off unless `host_bytes` > 0): each node has a cache of
`host_bytes` in host memory. A stage (storage → host) occupies the model's size in its node's cache
from the moment it starts and takes size / `stage_bandwidth` alone; k stages running at once on
one node each progress at 1/k speed (they share the node's storage bandwidth; `contention="none"`:
they never slow each other). A load onto a GPU whose node holds the model staged (completed) is a
promotion: it takes the model's promotion time (host → device) instead of its load time, and
shares the GPU's link with other loads as any load does. Unstaging is instant, only of a completed
stage that no promotion is reading. Stages do not slow the GPU loads of their node (the storage
read and the host-to-device link are different paths in this model).

Memory-time: every residency (load start to eviction or end of trace) adds bytes × time to
"total"; the part after its last request (all of it if it never served one) adds to "idle".
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

import numpy as np

from prewarm.domain.action_kinds import AHEAD_OF_DEMAND
from prewarm.domain.baselines.placement import VictimHeaps
from prewarm.domain.baselines.shadow import PlacingFleet
from prewarm.domain.policy import PolicyConfig
from prewarm.domain.states import LOADING, PENDING, READY, STAGED

from .adapters import ADAPTER_DONE as _ADAPTER_DONE
from .adapters import AdapterSlots, AdapterView
from .fleet import Gpu, HostCopy, Link, Node, Replica
from .trace import GIB, Trace

# after the trace ends, ticks go on this long while requests wait (those still waiting are unserved)
DRAIN_S = 600.0

class Policy(Protocol):
    name: str
    tick_s: float | None

    def attach(self, sim: Simulation) -> None: ...

    def on_request(self, t: float, m: int, warm: bool) -> None: ...

    def on_miss(self, t: float, m: int) -> None: ...

    def on_stalled(self, t: float, models: list[int]) -> None: ...

    def on_ready(self, t: float, r: Replica) -> None: ...

    def on_load_start(self, t: float, r: Replica) -> None: ...

    def on_staged(self, t: float, c: HostCopy) -> None: ...

    def on_tick(self, t: float) -> None: ...

    def on_timer(self, t: float, payload: tuple) -> None: ...


# same-instant order: completions first (an adapter's load too, issue 29: 2, only adapter traces have it)
_LOAD_DONE, _STAGE_DONE, _TIMER, _TICK = 0, 1, 3, 4


class Simulation(PlacingFleet):
    def __init__(
        self,
        trace: Trace,
        sizes: np.ndarray,
        load_s: np.ndarray,
        gpus: int,
        gpu_bytes: int,
        contention: str = "shared",
        nodes: int | None = None,
        host_bytes: int = 0,
        stage_bandwidth: float = 2.0 * GIB,
        promote_s: np.ndarray | None = None,
        promote_bandwidth: float | None = None,
        load_slots: int = 2,
        priority: list[int] | None = None,
        max_replica_age: list[float | None] | None = None,
        adapters: AdapterView | None = None,
    ) -> None:
        """`host_bytes`: each node's host cache (0: no staging tier). `stage_bandwidth`: a node's
        storage → host bytes/s. Promotion time (host → GPU) per model: `promote_s` if given, else
        `PolicyConfig().default_promote_seconds(size)` (with `promote_bandwidth` in place of its
        host-to-device bandwidth if given); either way at most the model's load time.
        `load_slots`: loads one GPU runs at once, the rest queue FIFO (0: no limit) — highest
        `priority` first (per model, prewarm.priority's rank; default all normal), as the worker.
        `max_replica_age`: per model, the catalog field prewarm's policy refreshes by (None: none).
        `adapters` (issue 29): the trace's LoRA adapters and their bases (simulator.adapters): `trace` is then
        the bases' view of it (each adapter request counted for its base) and the slots model serves them."""
        if load_slots < 0:
            raise ValueError(f"load_slots must be 0 (no limit) or more, not {load_slots}")
        self.load_slots = int(load_slots)
        self.trace = trace
        self.sizes = [int(x) for x in sizes]
        self.load_s = [float(x) for x in load_s]
        self.n_models = len(trace.models)
        self.priority = list(priority) if priority is not None else [1] * self.n_models
        self.prio_on = len(set(self.priority)) > 1  # all equal: the queue is plain FIFO
        self.max_replica_age = list(max_replica_age) if max_replica_age is not None else [None] * self.n_models
        self.shared = contention == "shared"
        per_node = 8 if nodes is None else max(1, math.ceil(gpus / nodes))
        self.gpus = [
            Gpu(i, f"node-{i // per_node}/cuda:{i % per_node}", f"node-{i // per_node}", gpu_bytes)
            for i in range(gpus)
        ]
        self.nodes: list[Node] = []
        node_index: dict[str, int] = {}
        for g in self.gpus:
            if g.node not in node_index:
                node_index[g.node] = len(self.nodes)
                self.nodes.append(Node(len(self.nodes), g.node, max(0, int(host_bytes))))
            g.ni = node_index[g.node]
        self.host_on = host_bytes > 0
        self.stage_bandwidth = float(stage_bandwidth)
        if promote_s is None:
            cfg = PolicyConfig() if promote_bandwidth is None else PolicyConfig(
                promote_bandwidth_bytes_per_s=float(promote_bandwidth))
            promote_s = [cfg.default_promote_seconds(x) for x in self.sizes]
        self.promote_s = [min(float(p), ls) for p, ls in zip(promote_s, self.load_s, strict=True)]
        self.host_version = 0  # bumped on every change of any host cache (for snapshot caching)
        self.replicas: list[dict[int, Replica]] = [{} for _ in range(self.n_models)]  # model -> gpu -> r
        self.ready_count = [0] * self.n_models
        self.waiting: list[list[float]] = [[] for _ in range(self.n_models)]
        self.stalled: dict[int, None] = {}  # models with waiting requests and no load (ordered)
        self.victims: list[Replica] = []  # what the last place_evicting evicted (baselines.base.Fleet)
        self.last_arrival: list[float | None] = [None] * self.n_models  # the baselines' LRU clock (base.recency)
        self.events: list[tuple[float, int, int, tuple]] = []
        self._seq = 0
        self.now = 0.0
        # metrics
        self.cold = 0
        self.avoided = 0  # warm requests served by a replica loaded ahead of demand (the ROI's, as live)
        self.cold_per_model = [0] * self.n_models
        self.req_per_model = [0] * self.n_models
        self.waits: list[float] = []
        self.loads = 0
        self.loads_per_model = [0] * self.n_models  # an adapter trace's engine starts are its bases'
        self.queued_loads = 0  # loads that waited for a load slot
        self.cancelled_loads = 0  # loads cancelled in flight (cancel_load)
        self.bytes_loaded = 0
        self.mem_total = 0.0  # byte-seconds
        self.mem_idle = 0.0
        self.evictions = 0
        self.last_evicted: dict[int, float] = {}
        self.stages = 0
        self.bytes_staged = 0
        self.unstages = 0
        self.promotions = 0
        self.host_mem = 0.0  # byte-seconds held in host caches
        self.policy: Policy | None = None
        # LoRA adapters inside their bases' replicas (issue 29): None for a trace of whole models
        self.ad: AdapterSlots | None = AdapterSlots(self, adapters) if adapters is not None else None

    # ---- events ---------------------------------------------------------------------------
    def push(self, t: float, kind: int, payload: tuple) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, payload))

    def timer(self, t: float, payload: tuple) -> None:
        self.push(t, _TIMER, payload)

    # ---- loads ----------------------------------------------------------------------------
    def _reschedule(self, link: Link, kind: int, index: int) -> None:
        done = link.next_done(self.shared)
        if done is not None:
            self.push(done, kind, (index, link.version))

    def start_load(self, m: int, gi: int, kind: str = "") -> Replica | None:
        """Send a load of model m to GPU gi: None (nothing done) if gi holds m or lacks its bytes.
        The bytes are reserved at once; the load starts now, or when a slot frees (FIFO)."""
        g = self.gpus[gi]
        size = self.sizes[m]
        if m in g.residents or g.capacity - g.used < size:
            return None
        t = self.now
        r = Replica(m, gi, size, t, remaining=self.load_s[m], kind=kind)
        if self.host_on:
            c = self.nodes[g.ni].cached.get(m)
            if c is not None and c.state == STAGED:
                r.remaining = self.promote_s[m]
                r.source = c
                c.readers += 1
                self.promotions += 1
        g.residents[m] = r
        g.used += size
        self.replicas[m][gi] = r
        self.loads += 1
        self.loads_per_model[m] += 1
        self.bytes_loaded += size
        self.stalled.pop(m, None)
        if self.slots_busy(gi):
            r.state = PENDING
            g.queue.append(r)
            self.queued_loads += 1
        else:
            g.link.advance(t, self.shared)
            g.link.jobs.append(r)
            self._reschedule(g.link, _LOAD_DONE, gi)
        return r

    def evict(self, m: int, gi: int) -> bool:
        r = self.remove_ready(m, gi)
        if r is None:
            return False
        t = self.now
        self._close(r, t)
        self.evictions += 1
        if self.ad is not None:
            self.ad.base_evicted(r)  # its adapters go with its engine
        self.last_evicted[m] = t
        return True

    def cancel_load(self, m: int, gi: int) -> bool:
        """Cancel model m's load on GPU gi (holding a slot or queued for one), as the worker's evict does a
        load in flight: its bytes are freed, the link's other loads speed up, a queued load takes the slot.
        False (nothing done) if gi has no load of m in flight."""
        g = self.gpus[gi]
        r = g.residents.get(m)
        if r is None or r.state == READY:
            return False
        t = self.now
        if r.state == PENDING:
            g.queue.remove(r)
        else:
            g.link.advance(t, self.shared)
            g.link.jobs.remove(r)
        if r.source is not None:
            r.source.readers -= 1
            r.source = None
        del g.residents[m]
        g.used -= r.bytes
        del self.replicas[m][gi]
        self._close(r, t)
        self.cancelled_loads += 1
        self.last_evicted[m] = t
        if self.waiting[m] and not self.replicas[m]:
            self.stalled[m] = None  # its waiting requests need another load: the policy is asked again
        self._fill_slots(gi, t)
        return True

    def _fill_slots(self, gi: int, t: float) -> None:
        """Freed slots go to the queued loads (_next_queued's order); the link's next completion is rescheduled."""
        g = self.gpus[gi]
        started = []
        while g.queue and not self.slots_busy(gi):
            q = self._next_queued(g)
            q.state = LOADING
            g.link.jobs.append(q)
            started.append(q)
        self._reschedule(g.link, _LOAD_DONE, gi)
        if self.policy is not None:
            for q in started:
                self.policy.on_load_start(t, q)

    def _close(self, r: Replica, t: float) -> None:
        self.mem_total += r.bytes * (t - r.since)
        last = r.last_request if r.last_request is not None else r.since
        self.mem_idle += r.bytes * (t - max(last, r.since))

    def _next_queued(self, g: Gpu) -> Replica:
        """The queued load a freed slot goes to: the highest priority, the oldest within it."""
        if not self.prio_on:
            return g.queue.popleft()
        best = max(range(len(g.queue)), key=lambda i: (self.priority[g.queue[i].model], -i))
        q = g.queue[best]
        del g.queue[best]
        return q

    def _load_done(self, gi: int, version: int) -> None:
        g = self.gpus[gi]
        if version != g.link.version:
            return
        t = self.now
        done = g.link.finished(t, self.shared)
        self._fill_slots(gi, t)
        for r in done:
            r.state = READY
            r.ready_at = t
            if self.heaps is not None:
                self.heaps.ready(r)
            if r.source is not None:
                r.source.readers -= 1
                r.source = None
            self.ready_count[r.model] += 1
            w = self.waiting[r.model]
            if w:
                if self.ad is not None and self.ad.max_adapters[r.model]:
                    self.ad.base_ready(t, r)  # its adapters load now; their requests are served after that
                else:
                    self.waits.extend(t - x for x in w)
                w.clear()
                r.last_request = t
            if self.policy is not None:
                self.policy.on_ready(t, r)
        self._retry_stalled()

    def _retry_stalled(self) -> None:
        """Give the policy another chance to place models whose requests wait with no load."""
        if not self.stalled or self.policy is None:
            return
        self.policy.on_stalled(self.now, [m for m in self.stalled if not self.replicas[m]])

    # ---- host-memory staging tier ---------------------------------------------------------
    def host_free(self, ni: int) -> int:
        n = self.nodes[ni]
        return n.capacity - n.used

    def start_stage(self, m: int, ni: int) -> HostCopy | None:
        """Start reading model m into node ni's host cache. None (nothing done) if the node already
        holds or is staging m, or its cache lacks room for m's bytes."""
        n = self.nodes[ni]
        size = self.sizes[m]
        if m in n.cached or n.capacity - n.used < size:
            return None
        t = self.now
        n.link.advance(t, self.shared)
        c = HostCopy(m, ni, size, t, remaining=size / self.stage_bandwidth)
        n.cached[m] = c
        n.used += size
        n.link.jobs.append(c)
        self.stages += 1
        self.bytes_staged += size
        self.host_version += 1
        self._reschedule(n.link, _STAGE_DONE, ni)
        return c

    def unstage(self, m: int, ni: int) -> bool:
        """Drop model m from node ni's host cache: only a completed stage no promotion is reading."""
        n = self.nodes[ni]
        c = n.cached.get(m)
        if c is None or c.state != STAGED or c.readers:
            return False
        del n.cached[m]
        n.used -= c.bytes
        self.host_mem += c.bytes * (self.now - c.since)
        self.unstages += 1
        self.host_version += 1
        return True

    def _stage_done(self, ni: int, version: int) -> None:
        n = self.nodes[ni]
        if version != n.link.version:
            return
        t = self.now
        done = n.link.finished(t, self.shared)
        self._reschedule(n.link, _STAGE_DONE, ni)
        for c in done:
            c.state = STAGED
            c.ready_at = t
        if done:
            self.host_version += 1
            if self.policy is not None:
                for c in done:
                    self.policy.on_staged(t, c)

    # ---- main loop ------------------------------------------------------------------------
    def serve(self, t: float, m: int, policy: Policy) -> None:
        """One request for a whole model (arrival already counted): warm on a ready replica, else cold,
        waiting for a load in flight or the policy's load on a miss. The adapter view's whole models too."""
        if self.ready_count[m]:
            for r in self.replicas[m].values():
                if r.state == READY:
                    r.last_request = t
                    self.avoided += r.kind in AHEAD_OF_DEMAND
                    break
            policy.on_request(t, m, True)
            return
        self.cold += 1
        self.cold_per_model[m] += 1
        self.waiting[m].append(t)
        policy.on_request(t, m, False)
        if not self.replicas[m]:
            self.stalled[m] = None
            policy.on_miss(t, m)

    def run(self, policy: Policy) -> None:
        self.policy = policy
        # a baseline rule with monotone keys: its victims from per-GPU lazy heaps (the same ones, found sooner)
        self.heaps = VictimHeaps(len(self.gpus)) if getattr(policy, "monotone_keys", False) else None
        policy.attach(self)
        times = self.trace.times.tolist()
        mids = self.trace.mids.tolist()
        end = max(self.trace.span_s, times[-1] if times else 0.0)
        tick = policy.tick_s
        if tick:
            self.push(0.0, _TICK, ())
        events = self.events
        last_arrival = self.last_arrival
        if self.ad is not None:
            self.ad.feed(policy, end)  # an adapter trace's requests go through its slots model instead
        for t, m in (zip(times, mids, strict=True) if self.ad is None else ()):
            while events and events[0][0] <= t:
                self._dispatch(heapq.heappop(events), end)
            self.now = t
            self.req_per_model[m] += 1
            last_arrival[m] = t
            self.serve(t, m, policy)
        # drain: finish loads so that every waiting request gets its wait; ticks go on only while
        # a request waits with no load (as live, where the scheduler keeps ticking)
        while events:
            ev = heapq.heappop(events)
            if ev[1] == _TICK and not self.stalled:
                continue
            if ev[1] == _TIMER and ev[0] > end:
                continue
            self._dispatch(ev, end)
        self.now = max(self.now, end)
        for g in self.gpus:
            for r in g.residents.values():
                self._close(r, self.now)
        for n in self.nodes:
            for c in n.cached.values():
                self.host_mem += c.bytes * (self.now - c.since)
        for m in range(self.n_models):  # requests that never got a replica (model fits no GPU)
            if self.waiting[m]:
                self.waits.extend(math.inf for _ in self.waiting[m])

    def _dispatch(self, ev: tuple[float, int, int, tuple], end: float) -> None:
        t, kind, _seq, payload = ev
        self.now = t
        if kind == _LOAD_DONE:
            self._load_done(*payload)
        elif kind == _TIMER:
            self.policy.on_timer(t, payload)  # type: ignore[union-attr]
        elif kind == _STAGE_DONE:
            self._stage_done(*payload)
        elif kind == _ADAPTER_DONE:
            self.ad.done(t, *payload)  # type: ignore[union-attr]
        else:
            self.policy.on_tick(t)  # type: ignore[union-attr]
            self._retry_stalled()
            tick = self.policy.tick_s  # type: ignore[union-attr]
            if tick and (t + tick <= end or (self.stalled and t + tick <= end + DRAIN_S)):
                self.push(t + tick, _TICK, ())

    # ---- results --------------------------------------------------------------------------
    def results(self) -> dict:
        n = self.trace.requests
        shares = [c / q for c, q in zip(self.cold_per_model, self.req_per_model, strict=True) if q]
        w = np.array(self.waits, dtype=float)
        unserved = int(np.sum(~np.isfinite(w)))  # models larger than any GPU
        w = w[np.isfinite(w)]
        served, served_total = int(len(w)), float(w.sum())
        if not len(w):
            w = np.zeros(1)
        return {
            "requests": n,
            "cold_starts": self.cold,
            "cold_start_share": self.cold / n if n else 0.0,
            "p75_model_cold_start_share": float(np.percentile(shares, 75)) if shares else 0.0,
            "wait_seconds": {
                "p50": float(np.percentile(w, 50)),
                "p95": float(np.percentile(w, 95)),
                "p99": float(np.percentile(w, 99)),
            },
            # what a router sees beside the count (issue 26): the seconds the cold requests waited, in
            # all and per cold request served; warm requests wait 0 and are not in it, unserved ones
            # (no finite wait) are counted in `unserved` instead
            "cold_wait_seconds": {"total": served_total, "mean": served_total / served if served else 0.0},
            "unserved": unserved,
            "loads": self.loads,
            "queued_loads": self.queued_loads,
            "cancelled_loads": self.cancelled_loads,
            "bytes_loaded": self.bytes_loaded,
            "evictions": self.evictions,
            "memory_gib_hours": {
                "idle": self.mem_idle / GIB / 3600.0,
                "total": self.mem_total / GIB / 3600.0,
            },
            # host-memory staging tier (all 0 when it is off)
            "stages": self.stages,
            "bytes_staged": self.bytes_staged,
            "unstages": self.unstages,
            "promotions": self.promotions,
            "host_memory_gib_hours": self.host_mem / GIB / 3600.0,
            # what warmth cost and bought (the live /api/roi's figures, fleet-wide)
            "roi": {"gpu_memory_gib_hours": self.mem_total / GIB / 3600.0, "warm_hits": n - self.cold,
                    "cold_starts": self.cold, "cold_starts_avoided": self.avoided},
            **({"adapters": self.ad.results()} if self.ad is not None else {}),
        }
