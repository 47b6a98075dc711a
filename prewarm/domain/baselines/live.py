"""A baseline's decision rule on the live fleet: each tick's snapshot becomes the rule's events, and what it
does becomes Preload / Evict actions for the same dispatch path prewarm's plan uses.

Per `decide(snapshot, now, arrivals)` call, in this order (the simulator delivers the same events at their
exact times; live they arrive once a tick):
1. the requests reported since the last call (`arrivals`: the traffic store's per-second counts, as fed
   to prewarm's history, each at the middle of its second) in time order, each an `on_request` (warm when the model had a ready replica),
   with the rule's timers that fell due before each one (`on_timer`);
2. the timers due by `now`;
3. replicas that turned ready since the last call: `on_ready`;
4. `on_tick` when the rule's own period (`tick_s`) has passed;
5. models the route hook found cold (`snapshot.waiting`: a router waits) with no replica and no load in
   flight: `on_stalled`, i.e. a miss — the rule places them (the route hook itself already started an
   on-demand preload where a GPU had room).

`SnapshotFleet` is the rule's `Fleet` for one call: the snapshot's replicas plus the unconfirmed intents
(the policy package's tentative `fleet.Fleet` does the byte and load accounting), updated by each action
the call takes so that a second placement sees the first. Models and GPUs get stable small indexes (the
catalog's models at the first call; GPUs as they join). A replica's last request: the last one reported for
the model while it was ready, else the worker's last use, else none; the LRU key (`base.recency`) is the
model's latest reported arrival for a replica that has served a request, else its load start (as in the
simulator).
Not modelled live: a version under rollout or an old version resident (not indexed: never placed or
evicted by a baseline, its bytes still count), pins and min_replicas (prewarm's rules, not the baselines').
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.action_kinds import DEMAND, MAKE_ROOM, QUIET
from prewarm.domain.states import EVICTING, PENDING, READY

from ..policy.adapters import bases_view
from ..policy.fleet import Fleet as Tentative
from ..policy.types import Action, Evict, PolicyConfig, Preload, Snapshot
from ..policy.value import load_seconds
from .base import Rule
from .placement import choose

Arrival = tuple[str, float, int]  # (model key, second, requests in it)


@dataclass(eq=False, slots=True)
class LiveReplica:
    model: int
    gpu: int
    bytes: int
    since: float
    state: str
    last_request: float | None = None


@dataclass(slots=True)
class LiveGpu:
    index: int
    id: str
    capacity: int
    residents: dict[int, LiveReplica] = field(default_factory=dict)


class SnapshotFleet:
    """One call's view of the live fleet, as a baselines `Fleet`; `actions` collects what the rule did."""

    def __init__(self, snap: Snapshot, now: float, names: list[str], index: dict[str, int],
                 gpu_index: dict[str, int], last_req: dict[tuple[int, int], float],
                 timer: Callable[[float, tuple], None], policy: str,
                 last_arrival: list[float | None]) -> None:
        cfg = snap.config
        self.now = now
        self.policy = policy
        self.names = names
        self.n_models = len(names)
        self.sizes = [0] * self.n_models
        self.load_s = [0.0] * self.n_models
        for key, m in index.items():
            spec = snap.models.get(key)
            if spec is not None:
                self.sizes[m] = spec.size_bytes
                self.load_s[m] = load_seconds(spec, cfg)
        self._timer = timer
        self.max_loads = cfg.max_loads_per_gpu
        self.t = Tentative(snap, now)
        for gid in sorted(self.t.gpus):
            gpu_index.setdefault(gid, len(gpu_index))
        self.gpus = [LiveGpu(gpu_index[gid], gid, self.t.gpus[gid].total_bytes) for gid in sorted(self.t.gpus)]
        self.by_index = {g.index: g for g in self.gpus}
        self.extra = dict.fromkeys(self.by_index, 0)  # bytes this call freed (+) or promised (-)
        self.loads = {g.index: self.t.loading[g.id] for g in self.gpus}
        self.replicas: list[dict[int, LiveReplica]] = [{} for _ in range(self.n_models)]
        for g in self.gpus:
            for key, r in self.t.on_gpu[g.id].items():
                m = index.get(key)
                if m is None:
                    continue
                st = EVICTING if (key, g.id) in self.t.evicting else r.state
                last = max((x for x in (last_req.get((m, g.index)), r.last_request) if x is not None),
                           default=None)
                self._add(LiveReplica(m, g.index, r.bytes, r.since, st, last))
        for it in snap.intents:  # preloads sent but not visible yet: a replica on its way
            m = index.get(it.model)
            g = self.by_index.get(gpu_index.get(it.gpu, -1))
            if (it.kind != "preload" or m is None or g is None or it.expires_at <= now
                    or m in g.residents):
                continue
            self._add(LiveReplica(m, g.index, it.bytes or self.sizes[m], now, PENDING))
        self.stalled: dict[int, None] = {}
        self.victims: list[LiveReplica] = []  # what the last place_evicting evicted
        self.last_arrival = last_arrival  # the policy's, updated as each call's arrivals are delivered
        self.actions: list[Action] = []

    def _add(self, r: LiveReplica) -> None:
        self.replicas[r.model][r.gpu] = r
        self.by_index[r.gpu].residents[r.model] = r

    def ready(self, m: int) -> LiveReplica | None:
        return next((r for r in self.replicas[m].values() if r.state == READY), None)

    # ---- the Fleet protocol -------------------------------------------------------------------
    def free(self, gi: int) -> int:
        return self.t.avail(self.by_index[gi].id) + self.extra[gi]

    def place_evicting(self, m: int, key: Callable[[Any], float], only_if: Callable[[Any], bool] | None = None,
                       kind: str = "") -> LiveReplica | None:
        best = choose(self.gpus, m, self.sizes[m], key, only_if, self.free, self.loads.__getitem__, self.max_loads)
        self.victims = [] if best is None else best[1]
        if best is None:
            return None
        gi, victims = best
        for r in victims:
            self._evict(r, MAKE_ROOM, f"{self.policy}: making room for {self.names[m]} (next in its eviction "
                                        "order)")
        return self.start_load(m, gi, kind)

    def start_load(self, m: int, gi: int, kind: str = "") -> LiveReplica | None:
        g = self.by_index[gi]
        size = self.sizes[m]
        if m in g.residents or self.free(gi) < size:
            return None
        r = LiveReplica(m, gi, size, self.now, PENDING)
        self._add(r)
        self.extra[gi] -= size
        self.loads[gi] += 1
        self.stalled.pop(m, None)
        self.actions.append(Preload(self.names[m], g.id, kind or DEMAND,
                                    f"{self.policy}: load {self.names[m]} ({kind or DEMAND})",
                                    {"size_bytes": size, "free_bytes": self.free(gi) + size}, bytes=size))
        return r

    def evict(self, m: int, gi: int) -> bool:
        r = self.replicas[m].get(gi)
        if r is None or r.state != READY:
            return False
        self._evict(r, QUIET, f"{self.policy}: its rule unloads {self.names[m]} (keep-alive over, or unloaded until its pre-warm window)")
        return True

    def _evict(self, r: LiveReplica, kind: str, reason: str) -> None:
        del self.replicas[r.model][r.gpu]
        g = self.by_index[r.gpu]
        del g.residents[r.model]
        self.extra[r.gpu] += r.bytes
        self.actions.append(Evict(self.names[r.model], g.id, kind, reason, {"size_bytes": r.bytes}))

    def timer(self, t: float, payload: tuple) -> None:
        self._timer(t, payload)

    def resident_keys(self) -> set[tuple[int, int]]:
        return {(m, gi) for m, reps in enumerate(self.replicas) for gi in reps}


class BaselinePolicy:
    """A baseline rule run live: `decide(snapshot, now, arrivals)` → actions (see the module docstring)."""

    def __init__(self, name: str, rule: Rule, config: PolicyConfig) -> None:
        self.name = name
        self.rule = rule
        self.config = config
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.gpu_index: dict[str, int] = {}
        self.timers: list[tuple[float, int, tuple]] = []
        self._seq = 0
        self.last_req: dict[tuple[int, int], float] = {}
        self.last_arrival: list[float | None] = []  # model -> its latest request's arrival
        self.was_ready: set[tuple[int, int]] = set()
        self.next_tick: float | None = None
        self.attached = False

    def _timer(self, t: float, payload: tuple) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (t, self._seq, payload))

    def wakes_on_ready(self) -> bool:
        """A rule places a miss that found no room when a load finishes (`Rule.on_stalled`, at that instant in
        the simulator): live, a load turning ready while requests wait wakes the leader for it at once."""
        return True

    def _fire(self, until: float) -> None:
        while self.timers and self.timers[0][0] <= until:
            t, _seq, payload = heapq.heappop(self.timers)
            self.rule.on_timer(t, payload)

    def decide(self, snap: Snapshot, now: float, arrivals: Sequence[Arrival] = ()) -> list[Action]:
        # LoRA adapters (issue 29): a baseline plans their bases, from the bases' traffic (which counts their
        # adapters' requests), as any model; the adapters themselves get vLLM's own mechanics (the route hook's
        # load on a miss, LRU in the engine's slots), as in the simulator. Their own arrivals index nothing.
        snap = bases_view(snap)
        if not self.attached:
            # the catalog's current versions (an "<id>@<version>" key is a rollout or an old version)
            self.names = sorted(k for k in snap.models if "@" not in k)
            self.index = {k: i for i, k in enumerate(self.names)}
            self.last_arrival = [None] * len(self.names)
        fleet = SnapshotFleet(snap, now, self.names, self.index, self.gpu_index, self.last_req, self._timer,
                              self.name, self.last_arrival)
        rule = self.rule
        if not self.attached:
            rule.attach(fleet)
            self.attached = True
            if rule.tick_s:
                self.next_tick = now + rule.tick_s  # the simulator's tick at 0 sees no finished period either
        rule.fleet = fleet
        for model, second, count in sorted(arrivals, key=lambda a: a[1]):
            m = self.index.get(model)
            if m is None:
                continue
            t = second + 0.5  # the store counts per second: a request of second s came within [s, s + 1)
            self._fire(t)
            self.last_arrival[m] = t
            for _ in range(count):
                r = fleet.ready(m)
                if r is not None and t < r.since:
                    r = None  # reported late: it came before this replica's load started, so it was cold
                if r is not None:
                    r.last_request = t
                    self.last_req[(m, r.gpu)] = t
                rule.on_request(t, m, r is not None)
        self._fire(now)
        ready_now = {(m, gi) for m, reps in enumerate(fleet.replicas) for gi, r in reps.items() if r.state == READY}
        for m, gi in sorted(ready_now - self.was_ready):
            r = fleet.replicas[m][gi]
            if self.names[m] in snap.waiting:
                r.last_request = now  # the requests that waited for it are served now
                self.last_req[(m, gi)] = now
            rule.on_ready(now, r)
        if self.next_tick is not None and now >= self.next_tick:
            rule.on_tick(now)
            while self.next_tick <= now:
                self.next_tick += rule.tick_s or 1.0
        for key in snap.waiting:
            m = self.index.get(key)
            if m is not None and not fleet.replicas[m]:
                fleet.stalled[m] = None
        if fleet.stalled:
            rule.on_stalled(now, list(fleet.stalled))
        held = fleet.resident_keys()
        self.was_ready = {k for k in ready_now if k in held}
        self.last_req = {k: v for k, v in self.last_req.items() if k in held}
        return fleet.actions
