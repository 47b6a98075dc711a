"""The no-regret layer (issue 26, item 2): a set of experts' eviction orders; the one whose record on this
traffic is best orders real evictions. The record is judged by duels of the real fleet's evictions by
default (duels.py; PolicyConfig.expert_duels), or by ghost fleets' misses (below).

A hand-built rule set wins on the traces it was tuned on and can lose to a simple caching rule
elsewhere. This layer bounds that regret the way adaptive caches do:

- ARC (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST 2003) keeps ghost
  lists of what it evicted and adapts between recency and frequency by the hits they would have had;
- LeCaR (Vietri et al., "Driving Cache Replacement with ML-based LeCaR", HotStorage 2018) runs LRU and
  LFU as experts, charges each the misses its choice would have caused, and follows the one with the
  least regret (weights by decayed regret);
- CACHEUS (Rodriguez et al., "Learning Cache Replacement with CACHEUS", FAST 2021) does the same with
  scan- and churn-resistant experts and a learning rate that adapts to the traffic.

Here, as in those, every expert keeps a *ghost* residency: which models it would hold in the same
memory (the fleet's total, one pool as the papers' caches), with the same load times (a model admitted
at t is warm from t + its load time: a request before then is a miss), and no real loads. Each is fed
the request stream the policy sees (the TrafficHistory's new requests at every plan() call: the trace
in the simulator, the snapshot's traffic live), so the experts are compared on exactly this traffic.
Misses are counted per expert with an exponential decay (half-life `PolicyConfig.expert_halflife_s`),
so the record is recent: traffic whose character changes changes the leader.

The experts (their eviction order; the ghost loads on a miss as every policy does):
- `prewarm`: prewarm's own value order, the lowest expected cold requests per second per byte
  (`Values.loss`), taken among the EXPERT_SAMPLE least recently used ghost residents (sampled
  eviction as in Redis' approximated LRU: valuing every resident at each eviction would cost
  O(models));
- `greedy-dual`: FaasCache's Greedy-Dual (Fuerst & Sharma, ASPLOS 2021): priority = clock + frequency
  × load time / size, the clock rising to each victim's priority (the `faascache` baseline's rule);
- `lru`: the least recently requested first (the `on-demand-lru` baseline's rule);
- `forecast`: the `forecast` baseline's rule: models whose request rate gives P(a request within their
  load time + one tick) >= 0.3 are kept, the others go least recently used first (the rate here is the
  traffic's 60 s EWMA, not the baseline's fitted exponential smoothing: same threshold, cheaper input);
- `recency`: the least recently requested first, replicas in a quiet stretch of their timeline among the rest (not
  first, as in every other order: soft release). It is the order the whole experts' long record lends the plan where
  cold starts are sparse and on-demand LRU's shadow is ahead (whole.py, ORDER_OF): there quiet stretches end within
  hours, and one-step duels do not see what the order gains (docs/simulation.md, "Sparse traffic: LRU's order, lent").

The ghosts' misses are not the default judge (PolicyConfig.expert_duels=False selects them): measured on
both trace families, their lead does not carry over to the real fleet (ServeGen 72 h on 16 × 80 GiB:
greedy-dual leads the ghosts by 18 % and following its order costs +15 % cold starts; docs/simulation.md).
With duels judging, the ghosts give the misses shown beside the lead. Greedy-dual ranks *real* victims by
keys kept on the real fleet (RealGreedyDual: its frequencies, priorities and clock, as the faascache baseline
keeps them), not by its ghost's: the ghost holds other models than the fleet, and a real resident it had
dropped went first whatever its traffic (forced to lead on ServeGen 24 h × 16 seed 0, greedy-dual's order
gave 57,759 cold starts with the ghost's keys, 55,319 with the real ones; prewarm's own 51,213).
The layer is on by default (PolicyConfig.no_regret; PREWARM_NO_REGRET=0, `simulate --no-regret off` turn it
off): on the whole sweep it is within 1 % of off at every point, and on a trace built like the one the issue keeps
outside the project (60 ServeGen streams, 2–7 GiB models, 14 days, 1 / 2 / 4 × 40 GiB) within 0.2 %. It was off
for a while: the count it took new requests from halved with a busy model's histogram (TrafficHistory.total), so
it saw 102,269 of those 1,817,083 requests, greedy-dual's real keys stopped counting the busy models, and the
layer led that fleet to 4.8× the cold starts of prewarm's own order (docs/simulation.md, "The layer on
again").

How the record is used (`leader`): the incumbent is prewarm's own order; another expert takes the lead
only when its decayed misses are below the incumbent's by `expert_margin` (hysteresis, so that two
nearly equal experts do not swap victim orders every tick) and the record holds at least
EXPERT_MIN_MISSES misses (a fresh record decides nothing). The leader's order ranks the victims of
real evictions (`Values.victim_list`), after the replicas that are first victims whatever the order
(never requested since their load: fills and unused loads ahead; quiet ones). Loads ahead
(speculative, partners) are prewarm's own guesses: with `expert_gate_ahead` they go ahead only while
prewarm's order leads or its ghost misses are within `expert_margin` of the leader's. That gate is off
by default: the ghosts do not load ahead, so their record says nothing of what loads ahead are worth.

Cost: O(models with new requests) per call, each an O(log n) heap update per expert; evictions pop
lazily-invalidated heap entries. Pure: no I/O, no clock; deterministic for the stream fed in.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Mapping

from .duels import Duels
from .history import TrafficHistory, new_requests
from .types import GIB, ModelSpec, PolicyConfig

EXPERTS: tuple[str, ...] = ("prewarm", "greedy-dual", "lru", "forecast", "recency")
EXPERT_SAMPLE = 16  # prewarm's ghost values this many least recently used residents per eviction
EXPERT_MIN_MISSES = 8.0  # decayed misses the record must hold before it moves the lead
FORECAST_P = 0.3  # the forecast baseline's threshold (baselines.forecast.Forecast.threshold)
_HOT = 1e15  # added to a forecast-hot model's key: it goes after every model below the threshold


class Ghost:
    """One expert's ghost residency: models held in a pool of `capacity` bytes, each warm from its
    ready time; a lazily invalidated heap of (eviction key, version, model), the lowest key first."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.capacity = 0
        self.used = 0
        self.ready: dict[str, float] = {}  # held model -> when its ghost load finishes
        self.size: dict[str, int] = {}
        self.heap: list[tuple[float, int, str]] = []
        self.ver: dict[str, int] = {}
        self.key: dict[str, float] = {}  # held model -> its current eviction key
        self.seq = 0
        self.misses = 0.0  # decayed
        self.requests = 0.0  # decayed, for the miss ratio shown in reasons
        # greedy-dual: the clock and each model's requests since its ghost admission
        self.clock = 0.0
        self.freq: dict[str, int] = {}

    def push(self, m: str, key: float) -> None:
        self.seq += 1
        self.ver[m] = self.seq
        self.key[m] = key
        heap = self.heap
        heapq.heappush(heap, (key, self.seq, m))
        if len(heap) > 4 * len(self.ver) + 1024:
            # every hit leaves a stale entry behind: rebuild from the live ones (amortised O(1) a push)
            ver, keys = self.ver, self.key
            self.heap = [(keys[x], v, x) for x, v in ver.items()]
            heapq.heapify(self.heap)

    def drop(self, m: str) -> None:
        self.used -= self.size.pop(m)
        del self.ready[m]
        self.ver.pop(m, None)
        self.key.pop(m, None)
        self.freq.pop(m, None)


class RealGreedyDual:
    """Greedy-dual's keys for the real fleet's replicas, kept as the `faascache` baseline keeps them
    (baselines.faascache): a model's frequency counts its requests since it last had no replica; its
    priority, set at each request, is the clock then + frequency × load time / GiB; the clock rises to each
    real victim's priority. The ghost's keys would not do: the ghost holds other models than the fleet,
    and a real resident the ghost had dropped would go first whatever its traffic."""

    __slots__ = ("clock", "freq", "prio")

    def __init__(self) -> None:
        self.clock = 0.0
        self.freq: dict[str, float] = {}
        self.prio: dict[str, float] = {}

    def request(self, m: str, n: float, ld: float, size: int) -> None:
        f = self.freq.get(m, 0.0) + n
        self.freq[m] = f
        self.prio[m] = self.clock + f * ld / max(size / GIB, 1e-3)

    def key(self, m: str) -> float:
        return self.prio.get(m, self.clock)  # never requested since it had no replica: at the clock

    def evicted(self, m: str, last: bool) -> None:
        """A real eviction of `m` (`last`: it has no replica left: its frequency starts again)."""
        p = self.prio.get(m)
        if p is not None and p > self.clock:
            self.clock = p
        if last:
            self.prio.pop(m, None)
            self.freq.pop(m, None)


class Experts:
    """The layer's record, kept in PolicyState.experts from call to call (see the module docstring)."""

    def __init__(self, names: tuple[str, ...] = EXPERTS) -> None:
        """`names`: the experts (of EXPERTS), the incumbent first (plan() uses all, prewarm first)."""
        bad = [n for n in names if n not in EXPERTS]
        if bad or not names:
            raise ValueError(f"experts: unknown {bad} (known: {', '.join(EXPERTS)})")
        self.names = names
        self.ghosts: list[Ghost] = []
        self.seen: dict[str, float] = {}
        self.ld: dict[str, float] = {}
        self.seq = -1
        self.traffic_id = 0
        self.last_now = -math.inf
        self.leader = names[0]
        self.switches = 0
        self.reset(0)

    def reset(self, traffic_id: int) -> None:
        """A new record (a new TrafficHistory: the stream starts again)."""
        self.ghosts = [Ghost(n) for n in self.names]
        self.seen = {}  # model -> requests fed so far (TrafficHistory.total)
        self.ld = {}  # model -> its load seconds at its last request (forecast's re-check)
        self.seq = -1  # traffic seq fed up to
        self.traffic_id = traffic_id
        self.last_now = -math.inf
        self.leader = self.names[0]
        self.switches = 0
        self.duels = Duels(self.names)
        self.gd = RealGreedyDual()
        self.by_duels = True  # PolicyConfig.expert_duels, set by the feed
        # whether the ghosts are fed: only where their misses decide something (they judge the lead, or gate
        # loads ahead); with the duels judging and the gate off (the defaults) they would cost about 7 % of a
        # plan() call (Azure 1,350 × 8, native build) and change no decision
        self.ghosts_fed = False

    # ---- the record ----------------------------------------------------------------------
    def ghost(self, name: str) -> Ghost:
        return self.ghosts[self.names.index(name)]

    def misses(self, name: str) -> float:
        return self.ghost(name).misses if name in self.names else math.inf

    def lead_misses(self) -> float:
        return self.misses(self.leader)

    def ahead_ok(self, cfg: PolicyConfig) -> bool:
        """Loads ahead go on while prewarm's own order is within the margin of the leader's misses."""
        if self.leader == "prewarm" or "prewarm" not in self.names:
            return True
        return self.misses("prewarm") * (1.0 - cfg.expert_margin) <= self.lead_misses()

    def why(self) -> str:
        """The lead in words, for reasons and the console."""
        if self.by_duels:
            return self.duels.why()
        parts = ", ".join(f"{g.name} {g.misses:.0f}" for g in self.ghosts)
        return f"expert {self.leader} leads (ghost misses, decayed: {parts})"

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"leader": self.leader, "switches": self.switches, "duels": self.duels.describe()}
        if self.ghosts_fed:
            out["misses"] = {g.name: round(g.misses, 2) for g in self.ghosts}
            out["requests"] = round(self.ghosts[0].requests, 2)
        return out

    def order(self, leader: str, tr: TrafficHistory, now: float, cfg: PolicyConfig,
              entries: list[tuple[float, str, object]], quiet: Collection[str]) -> None:
        """Sort a GPU's victim entries ((value per GiB, model, replica), Values.victim_list) in the
        leader's eviction order, after the first victims of every order: models never requested, and `quiet`
        ones (but for `recency`)."""
        # decorated, not sort(key=...): the keys are made by direct calls, and flat (rank, value, model, index) tuples
        # compare natively (the model makes each key unique, so the index never decides)
        keyed: list[tuple[int, float, str, int]] = []
        for i, e in enumerate(entries):
            m = e[1]
            a = tr.last_arrival(m)
            if a is None or (m in quiet and leader != "recency"):
                keyed.append((0, e[0], m, i))
            elif leader == "greedy-dual":
                keyed.append((1, self.gd.key(m), m, i))
            elif leader == "forecast":
                lam = tr.rate_short(m, now)
                hot = -math.expm1(-lam * (self.ld.get(m, 0.0) + cfg.tick_s)) >= FORECAST_P
                keyed.append((1, a + (_HOT if hot else 0.0), m, i))
            else:
                keyed.append((1, a, m, i))
        keyed.sort()
        entries[:] = [entries[k[3]] for k in keyed]

    def adopt(self, name: str, now: float) -> bool:
        """`name`'s order leads from now on the whole experts' long record (whole.py: sparse traffic); False where
        it leads already, sits out a ban or a trial runs (Duels.adopt)."""
        if not self.duels.adopt(name, now):
            return False
        self.leader = name
        self.switches += 1
        return True

    def adopted_order(self) -> str | None:
        """The order adopted on the whole experts' long record (`adopt`) while it stands: leading, or the lead that a
        short-record trial on top of it returns to if its candidate fails; None once the plan's own record moved the
        lead (a trial's candidate won, or the ghosts chose another)."""
        d = self.duels
        if not d.adopted:
            return None
        if d.trial is not None:
            return d.trial.before
        return d.leader if self.leader == d.leader else None

    def on_trial(self) -> bool:
        """A short-record trial runs (Duels.trial): its turns move the lead, whatever was adopted."""
        return self.duels.trial is not None

    def give_back(self, name: str, now: float) -> None:
        """The adopted `name`'s course was worse (whole.py): the home order leads again (Duels.give_back)."""
        if self.duels.give_back(name, now):
            self.leader = self.duels.leader

    def _choose(self, cfg: PolicyConfig) -> None:
        if cfg.expert_duels:
            if self.duels.choose(cfg.prefetch_margin, self.last_now):
                self.switches += 1
            self.leader = self.duels.leader  # a trial's turns move it too
            return
        inc = self.ghost(self.leader)
        best = min(self.ghosts, key=lambda g: (g.misses, self.names.index(g.name)))
        if best is inc or max(inc.misses, best.misses) < EXPERT_MIN_MISSES:
            return
        if best.misses < inc.misses * (1.0 - cfg.expert_margin):
            self.leader = best.name
            self.switches += 1

    # ---- feeding -------------------------------------------------------------------------
    def feed(self, tr: TrafficHistory, models: Mapping[str, ModelSpec], capacity: int, now: float,
             cfg: PolicyConfig, value: Callable[[str], float],
             cost: Callable[[str], float] | None = None, cold: Callable[[str], bool] | None = None) -> None:
        """Bring every ghost up to the traffic's new requests (the models changed since the last call,
        each its new requests at its last arrival, in time order). `value(model)`: prewarm's value per
        GiB of a model (prewarm's ghost evicts by it)."""
        if self.traffic_id != id(tr):
            self.reset(id(tr))
        if now > self.last_now and self.last_now > -math.inf:
            d = 0.5 ** ((now - self.last_now) / cfg.expert_halflife_s)
            for g in self.ghosts:
                g.misses *= d
                g.requests *= d
            self.duels.decay(d)
        self.duels.halflife = cfg.expert_halflife_s
        self.by_duels = cfg.expert_duels
        self.ghosts_fed = fed = cfg.expert_gate_ahead or not cfg.expert_duels
        self.last_now = max(self.last_now, now)
        self.duels.expire(now - cfg.expert_halflife_s)
        for g in self.ghosts:
            g.capacity = capacity
        batch = new_requests(tr, self.seq, self.seen, models.__contains__)
        self.seq = tr.seq
        if not batch:
            return
        for t, m, n in batch:
            sp = models[m]
            ld = sp.load_seconds if sp.load_seconds is not None else cfg.default_load_seconds(sp.size_bytes)
            self.ld[m] = ld
            size = sp.size_bytes
            if fed:
                for g in self.ghosts:
                    self._access(g, m, t, n, size, ld, tr, now, cfg, value)
            self.gd.request(m, n, ld, size)
            if cost is not None:
                self.duels.request(t, m, n, cost, cold is not None and cold(m))
        self._choose(cfg)

    def _key(self, g: Ghost, m: str, t: float, size: int, ld: float, tr: TrafficHistory, now: float,
             cfg: PolicyConfig) -> float:
        name = g.name
        if name == "greedy-dual":
            return g.clock + g.freq.get(m, 0) * ld / max(size / GIB, 1e-3)
        if name == "forecast":
            lam = tr.rate_short(m, now)
            hot = -math.expm1(-lam * (ld + cfg.tick_s)) >= FORECAST_P
            return t + (_HOT if hot else 0.0)
        return t  # lru, and prewarm's sample (its least recently used residents)

    def _access(self, g: Ghost, m: str, t: float, n: float, size: int, ld: float, tr: TrafficHistory,
                now: float, cfg: PolicyConfig, value: Callable[[str], float]) -> None:
        g.requests += n
        ready = g.ready.get(m)
        if ready is not None and ready <= t:
            g.freq[m] = g.freq.get(m, 0) + int(n)
            g.push(m, self._key(g, m, t, size, ld, tr, now, cfg))
            return
        g.misses += n
        if ready is not None:  # its ghost load is in flight: the requests wait for it
            g.freq[m] = g.freq.get(m, 0) + int(n)
            g.push(m, self._key(g, m, t, size, ld, tr, now, cfg))
            return
        if size > g.capacity:
            return
        while g.used + size > g.capacity and g.ready:
            self._evict(g, tr, now, cfg, value)
        g.ready[m] = t + ld
        g.size[m] = size
        g.used += size
        g.freq[m] = int(n)
        g.push(m, self._key(g, m, t, size, ld, tr, now, cfg))

    def _pop(self, g: Ghost) -> tuple[float, str] | None:
        """The lowest valid heap entry, taken out."""
        heap, ver = g.heap, g.ver
        while heap:
            key, v, m = heapq.heappop(heap)
            if ver.get(m) == v:
                del ver[m]
                g.key.pop(m, None)
                return key, m
        return None

    def _evict(self, g: Ghost, tr: TrafficHistory, now: float, cfg: PolicyConfig,
               value: Callable[[str], float]) -> None:
        if g.name == "prewarm":
            sample: list[tuple[float, str]] = []
            while len(sample) < EXPERT_SAMPLE:
                got = self._pop(g)
                if got is None:
                    break
                sample.append(got)
            if not sample:
                return
            best = min(sample, key=lambda x: (value(x[1]), x[0], x[1]))
            for key, m in sample:
                if m != best[1]:
                    g.push(m, key)
            g.drop(best[1])
            return
        while True:
            got = self._pop(g)
            if got is None:
                return
            key, m = got
            if g.name == "forecast" and key >= _HOT:
                lam = tr.rate_short(m, now)
                hot = -math.expm1(-lam * (self.ld.get(m, 0.0) + cfg.tick_s)) >= FORECAST_P
                if not hot:  # its forecast fell below the threshold since its last request
                    g.push(m, key - _HOT)
                    continue
            if g.name == "greedy-dual":
                g.clock = max(g.clock, key)
            g.drop(m)
            return

