"""A shadow fleet: a baseline's whole policy run on a virtual fleet of the real one's shape, fed the real
request stream, so that its cold requests can be set beside the real fleet's (prewarm.domain.whole).

It is the simulator's fleet model (simulator.engine) cut to what a baseline rule touches: GPUs of the real
ones' memory; a load holds its model's bytes from the moment it is sent and takes the model's load time alone
on its GPU; k loads running at once on a GPU share its link (each at 1/k speed); a GPU runs at most
`load_slots` loads at once and queues the rest FIFO; eviction is instant and only of ready replicas. A request
is warm on a ready replica; else it is cold and waits for the load in flight, or the rule places one (a miss).
The rule places by `baselines.placement.choose`, as in the simulator and live. Same-instant order as the
engine's: loads that finish at a request's time finish first. No host tier, no adapters, no ticks (the rules
judged here, on-demand LRU and FaasCache, have none).

`delay` (seconds, 0 unless set): what a live fleet pays between a cold request and its load's start (a wake-up,
a tick, the task's queueing, a worker taking it), which the sizes and load times do not show. Live it is the
fleet's measured delay before a demand load (`Snapshot.demand_delay_s`); a replica then turns ready that long
after its load's last byte, the link and load slot freed at that byte (as they are free before the load starts
live). In the simulator it is 0 and a shadow is the engine's run of its rule. Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prewarm.domain.states import LOADING, PENDING, READY

from .base import Rule
from .placement import VictimHeaps, choose


@dataclass(slots=True)
class Link:
    """Jobs sharing one link (a GPU's loads, a node's stages): processor sharing, k jobs each at
    1/k speed (`shared` False: each at full speed)."""

    jobs: list = field(default_factory=list)  # jobs with `remaining` seconds at full speed
    last_update: float = 0.0
    version: int = 0  # bumped at every reschedule: a completion event of an older version is stale

    def advance(self, t: float, shared: bool) -> None:
        k = len(self.jobs)
        if k and t > self.last_update:
            step = (t - self.last_update) / (k if shared else 1)
            for j in self.jobs:
                j.remaining -= step
        self.last_update = t

    def finished(self, t: float, shared: bool) -> list:
        """Advance to `t` and take out the jobs that are done."""
        self.advance(t, shared)
        done = [j for j in self.jobs if j.remaining <= 1e-9]
        self.jobs = [j for j in self.jobs if j.remaining > 1e-9]
        return done

    def next_done(self, shared: bool) -> float | None:
        """New version; when the first job finishes at the current sharing, or None."""
        self.version += 1
        if not self.jobs:
            return None
        k = len(self.jobs) if shared else 1
        return self.last_update + max(0.0, min(j.remaining for j in self.jobs)) * k


@dataclass(eq=False, slots=True)
class ShadowReplica:
    model: int
    gpu: int
    bytes: int
    since: float  # load start
    remaining: float  # seconds of load work left at full speed
    state: str = LOADING
    last_request: float | None = None


@dataclass(slots=True)
class ShadowGpu:
    index: int
    capacity: int
    used: int = 0
    residents: dict[int, ShadowReplica] = field(default_factory=dict)
    link: Link = field(default_factory=Link)
    queue: deque[ShadowReplica] = field(default_factory=deque)


class PlacingFleet:
    """A baseline's placement on a fleet of GPUs with links and slots (the `baselines.base.Fleet` protocol's
    place_evicting), shared by the simulator's engine and the shadow fleets. The class using it has `gpus` (each
    with capacity, used, residents, link, queue), `sizes`, `load_slots`, `evict(m, gi)` and
    `start_load(m, gi, kind)`."""

    gpus: list[Any]
    sizes: list[int]
    load_slots: int
    victims: list[Any]
    heaps: VictimHeaps | None = None  # set by a fleet whose rule has monotone keys (`Rule.monotone_keys`)

    replicas: list[dict[int, Any]]  # model -> gpu -> its replica
    ready_count: list[int]  # model -> its ready replicas

    def evict(self, m: int, gi: int) -> bool:
        return self.remove_ready(m, gi) is not None

    def remove_ready(self, m: int, gi: int) -> Any:
        """Take model m's ready replica on GPU gi off the fleet's books (its bytes freed) and return it; None
        where it has none ready (a replica loading is never evicted, only cancelled)."""
        g = self.gpus[gi]
        r = g.residents.get(m)
        if r is None or r.state != READY:
            return None
        del g.residents[m]
        g.used -= r.bytes
        del self.replicas[m][gi]
        self.ready_count[m] -= 1
        return r

    def start_load(self, m: int, gi: int, kind: str = "") -> Any:
        raise NotImplementedError

    def free(self, gi: int) -> int:
        g = self.gpus[gi]
        return g.capacity - g.used

    def loads_on(self, gi: int) -> int:
        """Loads on GPU gi holding a slot or queued for one."""
        g = self.gpus[gi]
        return len(g.link.jobs) + len(g.queue)

    def slots_busy(self, gi: int) -> bool:
        """Every load slot of GPU gi is taken (a load sent now would queue)."""
        return 0 < self.load_slots <= len(self.gpus[gi].link.jobs)

    def resident_keys(self) -> set[tuple[int, int]]:
        """(model, gpu) of every replica held, in any state."""
        return {(r.model, r.gpu) for g in self.gpus for r in g.residents.values()}

    def place_evicting(self, m: int, key: Callable[[Any], float], only_if: Callable[[Any], bool] | None = None,
                       kind: str = "") -> Any:
        """Load model m where the baselines' placement rule says (`baselines.placement.choose`: a GPU
        with room, as `policy.placement.rank` orders them; else the GPU whose victims in ascending
        `key(replica)` order reach least far), evicting its victims first. `only_if(replica)` limits
        who may be evicted (always False: free memory only)."""
        best = choose(self.gpus, m, self.sizes[m], key, only_if, self.free, self.loads_on, self.load_slots,
                      self.heaps)
        self.victims = [] if best is None else best[1]
        if best is None:
            return None
        gi, victims = best
        for r in victims:
            self.evict(r.model, r.gpu)
        return self.start_load(m, gi, kind)


class ShadowFleet(PlacingFleet):
    """One baseline rule on a virtual fleet (the `baselines.base.Fleet` protocol). Feed it `request(t, m)` in
    time order; `ready(m)` says whether model m has a ready replica once `advance(t)` has brought it to t."""

    def __init__(self, rule: Rule, gpu_bytes: Sequence[int], sizes: Sequence[int], load_s: Sequence[float],
                 load_slots: int) -> None:
        self.rule = rule
        self.n_models = len(sizes)
        self.sizes = list(sizes)
        self.load_s = list(load_s)
        self.load_slots = load_slots
        self.gpus = [ShadowGpu(i, int(b)) for i, b in enumerate(gpu_bytes)]
        self.replicas: list[dict[int, ShadowReplica]] = [{} for _ in range(self.n_models)]
        self.ready_count = [0] * self.n_models
        self.waiting = [0] * self.n_models  # requests waiting for a replica
        self.stalled: dict[int, None] = {}
        self.victims: list[ShadowReplica] = []  # what the last place_evicting evicted
        self.last_arrival: list[float | None] = [None] * self.n_models
        self.now = 0.0
        # (when, seq, gpu, link version): load completions; gpu -1: a loaded replica turning ready (seq in _late)
        self.events: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.timers: list[tuple[float, int, tuple]] = []
        self.cold = 0
        self.requests = 0
        self.delay = 0.0
        self._late: dict[int, ShadowReplica] = {}  # seq -> a loaded replica ready at its event (`delay`)
        self.heaps = VictimHeaps(len(self.gpus)) if rule.monotone_keys else None
        rule.attach(self)  # type: ignore[arg-type]

    # ---- the stream ------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Finish the loads and fire the timers due by t (a load finishing at t finishes before a request at t)."""
        events, timers = self.events, self.timers
        while True:
            te = events[0][0] if events else None
            tt = timers[0][0] if timers else None
            if te is not None and te <= t and (tt is None or te <= tt):
                when, seq, gi, version = heapq.heappop(events)
                self.now = when
                if gi < 0:  # a loaded replica whose `delay` has passed
                    self._turn_ready(self._late.pop(seq), when)
                    self._stalled(when)
                else:
                    self._load_done(gi, version)
            elif tt is not None and tt <= t:
                when, _s, payload = heapq.heappop(timers)
                self.now = when
                self.rule.on_timer(when, payload)
            else:
                break
        self.now = max(self.now, t)

    def request(self, t: float, m: int) -> bool:
        """One request for model m at t (not before the last one): True if warm."""
        self.advance(t)
        self.requests += 1
        self.last_arrival[m] = t
        if self.ready_count[m]:
            for r in self.replicas[m].values():
                if r.state == READY:
                    r.last_request = t
                    break
            self.rule.on_request(t, m, True)
            return True
        self.cold += 1
        self.waiting[m] += 1
        self.rule.on_request(t, m, False)
        if not self.replicas[m]:
            self.stalled[m] = None
            self.rule.on_miss(t, m)
        return False

    def ready(self, m: int) -> bool:
        return self.ready_count[m] > 0

    # ---- the Fleet protocol (free, loads_on, place_evicting: PlacingFleet) -----------------------
    def start_load(self, m: int, gi: int, kind: str = "") -> ShadowReplica | None:
        g = self.gpus[gi]
        size = self.sizes[m]
        if m in g.residents or g.capacity - g.used < size:
            return None
        t = self.now
        r = ShadowReplica(m, gi, size, t, self.load_s[m])
        g.residents[m] = r
        g.used += size
        self.replicas[m][gi] = r
        self.stalled.pop(m, None)
        if self.slots_busy(gi):
            r.state = PENDING
            g.queue.append(r)
        else:
            g.link.advance(t, True)
            g.link.jobs.append(r)
            self._reschedule(gi)
        return r

    def timer(self, t: float, payload: tuple) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (t, self._seq, payload))

    # ---- loads ---------------------------------------------------------------------------------
    def _reschedule(self, gi: int) -> None:
        link = self.gpus[gi].link
        done = link.next_done(True)
        if done is not None:
            self._seq += 1
            heapq.heappush(self.events, (done, self._seq, gi, link.version))

    def _load_done(self, gi: int, version: int) -> None:
        g = self.gpus[gi]
        if version != g.link.version:
            return
        t = self.now
        done = g.link.finished(t, True)
        while g.queue and not self.slots_busy(gi):
            q = g.queue.popleft()
            q.state = LOADING
            g.link.jobs.append(q)
        self._reschedule(gi)
        if self.delay > 0.0:
            for r in done:
                self._seq += 1
                self._late[self._seq] = r
                heapq.heappush(self.events, (t + self.delay, self._seq, -1, 0))
            return
        for r in done:
            self._turn_ready(r, t)
        self._stalled(t)

    def _turn_ready(self, r: ShadowReplica, t: float) -> None:
        r.state = READY
        self.ready_count[r.model] += 1
        if self.heaps is not None:
            self.heaps.ready(r)
        if self.waiting[r.model]:
            self.waiting[r.model] = 0
            r.last_request = t
        self.rule.on_ready(t, r)

    def _stalled(self, t: float) -> None:
        if self.stalled:
            self.rule.on_stalled(t, [m for m in self.stalled if not self.replicas[m]])
