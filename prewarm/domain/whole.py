"""Whole experts (issue 26, item 2): prewarm never stays behind a whole baseline policy on this traffic.

The no-regret layer inside plan() (policy/experts.py, duels.py) weighs eviction *orders* on the GPUs prewarm
chose. That bounds regret against orders, not against policies: on bursty on/off traffic over a small fleet
whose links saturate, on-demand LRU as a whole (its GPU choice and its order, no loads ahead) had 9,144 cold
starts where prewarm had 11,656, and no order on prewarm's GPU choices came near it (docs/simulation.md,
"Synthetic regimes"). So here each whole baseline runs beside the real fleet as the experts of
"follow the leader" do (Kalai & Vempala, "Efficient algorithms for online decision problems", JCSS 2005;
Cesa-Bianchi & Lugosi, "Prediction, Learning, and Games", 2006, ch. 4: an expert switched to only when its
lead clears a margin, so that switches stay few):

- each expert (WHOLE_EXPERTS) is its baseline rule (prewarm.domain.baselines) on a *shadow fleet*
  (baselines.shadow): GPUs of the real ones' memory, the same load times, links and load slots, fed the
  requests the real fleet gets, so it is the simulator's run of that baseline, live;
- at each call, every request since the last one counts cold for the real fleet if the snapshot shows no
  ready replica of its model, and for a shadow if the shadow has none at the same moment (the same measure on
  both sides); the counts decay with a half-life of `PolicyConfig.expert_halflife_s`;
- while prewarm's plan leads, an expert whose shadow's decayed cold requests are below the real fleet's by
  MARGIN (and the fleet's record holds MIN_COLD) takes over: its rule plans the real fleet
  (baselines.live.BaselinePolicy, as when an operator picks it) for a hold, HOLD_HALFLIVES half-lives at first;
- where cold requests are sparse as a rule (per half-life, on average over the long record, fewer than MIN_COLD: tens
  of models on a fleet that holds most of them, cold starts hours apart), that record never judges. A long record of
  the same counts (LONG_HALFLIVES half-lives, a week at the default hour) does, once the real fleet has MIN_LONG cold
  requests on it, by the same MARGIN and only on evidence: the requests one side served cold and the other warm must
  favour the expert by LONG_Z standard deviations (McNemar's paired test; cf. CACHEUS's learning rate, which adapts
  to the traffic, for the two time scales). Its verdict is not a hand-over: prewarm's plan takes the expert's eviction
  order (ORDER_OF: on-demand LRU's is `recency`, policy/experts.py) and keeps its own fills, GPU choice and loads
  ahead, which beat LRU as a whole there when forced from the start (108 cold starts against 118 on 63 ServeGen
  streams × 4 GPUs). The record then starts again and judges the order's course against the same shadow at the ratio
  the two had when it was adopted (the shadow takes the traffic's own changes out); worse by MARGIN and GIVE_BACK_Z,
  the order is given back and sits out a ban (Duels.give_back). A long record that handed the fleet over was built
  first and not kept: the plan swapped between LRU and FaasCache 32 times in 4.5 h on a hand-built trace whose two
  shadows were within one cold request of each other (docs/simulation.md, "Sparse traffic");
- when the hold ends the plan goes back to prewarm's on probation: the records go on, and the expert takes
  over again only once prewarm's fleet falls behind its shadow by the margin again, for twice the hold. A
  leader that stays better is left after log2(hours) probations; one that was better only for a while costs
  at most the probation it takes to show it.

A shadow models what the specs say (sizes, measured load times), not a live cold start's other delays (the tick or
wake-up before a load is sent, the task's queueing, a worker taking it): those make the real fleet look worse than a
shadow of the same policy. Two measures bring a shadow to the live fleet. Before any hold, each shadow's replica turns
ready the fleet's measured delay before a demand load after its load (`Snapshot.demand_delay_s`: a cold start's
seconds beyond its replica's own load and warmup, the median of the last ones; 0 in the simulator). And each expert's
shadow is charged its own overhead, measured where the two run the same
policy on the same traffic at the same time: while the expert plans, the real fleet's cold requests against its
shadow's (`overhead`: their ratio, never below 1, once the shadow has HOLD_COLD of them). In the simulator the
expert's fleet matches its shadow (the engine has no such delays) and the charge stays near 1; live it keeps a fleet
whose overheads are larger than the margin from handing the plan to a baseline again and again.

Where the expert cannot stand in for prewarm it is not followed: a catalog with pins, replica floors or rate
caps (prewarm's rules, not the baselines'), or with LoRA adapters; the plan stays prewarm's there. The shadows
are rebuilt (their records with them) when the fleet's GPUs or the catalog's models change.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .baselines import RULES
from .baselines.live import Arrival, BaselinePolicy
from .baselines.shadow import ShadowFleet
from .policy.adapters import split
from .policy.fleet import ready_models
from .policy.types import Action, PolicyConfig, Snapshot
from .policy.value import load_seconds
from .policy.words import fmt_s
from .states import IN_FLIGHT, ROUTABLE

WHOLE_EXPERTS: tuple[str, ...] = ("on-demand-lru", "faascache")
HOME = "prewarm"
MARGIN = 0.1  # an expert's shadow must have this share fewer cold requests than the real fleet to take over
MIN_COLD = 100.0  # decayed cold requests on the real fleet's record before the lead may move
HOLD_HALFLIVES = 4.0  # an expert's first hold; doubled each time it takes the lead again
# Past this many GPUs the shadows are miniature fleets (Waldspurger et al., "Cache Modeling and Optimization using
# Miniature Simulations", USENIX ATC 2017; SHARDS, FAST 2015): this many of the GPUs and the models whose id hashes
# into the same share, each fleet's cold requests counted on those models only. Every sweep point (8-32 GPUs) runs
# whole; 10,000 models on 256 GPUs run 1/8 of each.
SAMPLE_GPUS = 32
# A probation's verdict: once prewarm's fleet has this many cold requests since it began (at most a half-life), the
# expert plans again if its shadow had fewer in the same span; else the records decide as before
PROBATION_COLD = 50.0
# An expert's overhead (its fleet's cold requests over its shadow's while it plans) is charged once its shadow has
# this many cold requests in its holds: fewer say little
HOLD_COLD = 50.0
# Sparse traffic (cold requests hours apart: the recent record never holds MIN_COLD): a long record of the same
# counts, decayed over this many half-lives (a week at the default hour), and per expert the requests one side served
# cold and the other warm ...
LONG_HALFLIVES = 168.0
MIN_LONG = 30.0  # ... judges once the real fleet has this many cold requests on it ...
# ... and only on evidence: those paired counts must favour the expert by this many standard deviations (McNemar's
# test: both sides serve the same requests), as well as by MARGIN. What it decides is not a hand-over (ORDER_OF)
LONG_Z = 2.0
# The eviction order inside prewarm's plan (policy/experts.py) that stands for each whole expert's rule: where the long
# record finds a whole expert ahead, prewarm's plan takes its order rather than handing the fleet to its rule
ORDER_OF = {"on-demand-lru": "recency", "faascache": "greedy-dual"}
# An order so adopted is given back when the real fleet's cold requests since exceed its yardstick (the adopted
# expert's shadow's, at their ratio when it was adopted) by MARGIN and this many standard deviations: a test repeated
# at every call over days (a sequential one: Pocock's bound for many looks is near 3, not 2), whose false alarm costs a
# ban. At 2 the 157-stream sparse view gave recency back after 73 h on 40 cold requests against 29 expected (2.05 sd),
# where recency led from the start has 172 cold starts against prewarm's own order's 303 (docs/simulation.md)
GIVE_BACK_Z = 3.0


class WholeExperts:
    """The shadows, their records and who plans now; `decide` is what PrewarmPolicy calls each tick."""

    def __init__(self) -> None:
        self.shadows: dict[str, ShadowFleet] = {}
        self._ids: list[str] = []  # the catalog's current versions
        self.index: dict[str, int] = {}  # the sampled ones (all of them up to SAMPLE_GPUS GPUs) -> shadow index
        self.names: list[str] = []
        self.rate = 1.0  # the share of GPUs and models the shadows hold
        self.origin = 0.0  # when the shadows were built: their clock's 0
        self.shape: tuple[Any, ...] | None = None
        self._models: object = None
        self.eligible = False
        self.real = 0.0  # decayed cold requests of the real fleet
        self.cold: dict[str, float] = {}  # and of each shadow
        self.requests = 0.0
        self.long_real = 0.0  # the long record (sparse traffic; LONG_HALFLIVES): the real fleet's cold requests
        self.long_cold: dict[str, float] = {}  # each shadow's
        self.long_worse: dict[str, float] = {}  # requests cold on the real fleet and warm on the shadow
        self.long_better: dict[str, float] = {}  # ... and the reverse
        self.age = 0.0  # half-lives fed since the shadows were built
        self.adopted: str | None = None  # the whole expert whose order (ORDER_OF) leads prewarm's plan on its verdict
        self.yardstick = 1.0  # the real fleet's cold requests over that expert's shadow's when it was adopted
        self.at: float | None = None
        self.since: float | None = None  # when the shadows started: a record younger than a half-life says nothing
        self.leader = HOME
        self.until = 0.0
        self.hold: dict[str, float] = {}
        self.switches = 0
        self.moves: list[tuple[float, str]] = []  # (when, who plans from then): the lead's history
        self.baseline: BaselinePolicy | None = None
        # a probation (prewarm plans again after an expert's hold): that expert, and both sides' cold requests since
        self.probation: str | None = None
        self.trial_real = 0.0
        self.trial_cold = 0.0
        self.trial_since = 0.0
        # while an expert plans: the real fleet's cold requests and its shadow's, summed over its holds
        self.held: dict[str, list[float]] = {}
        self.delay = 0.0  # the live fleet's delay before a demand load that the shadows pay (Snapshot.demand_delay_s)

    # ---- the record ------------------------------------------------------------------------------
    def _catalog(self, snap: Snapshot) -> None:
        """Whether an expert may stand in for prewarm on this catalog; its models' indexes for the shadows; the
        shadows' sizes and load times brought to the specs' (live, a measured load time replaces the default
        from the model's size: a shadow loading at the default would run ahead of the fleet it is judged against)."""
        if snap.models is self._models:
            return
        self._models = snap.models
        models = snap.models
        self.eligible = split(models) is None and not any(
            s.pinned or s.min_replicas > 0 or s.max_rate_per_replica for s in models.values())
        ids = sorted(k for k in models if "@" not in k)
        if self._ids != ids:
            self._ids = ids
            self.shape = None  # the shadows index models: new ones for a new catalog
            return
        sizes, loads = self._specs(snap)
        for sh in self.shadows.values():
            sh.sizes[:], sh.load_s[:] = sizes, loads

    def _specs(self, snap: Snapshot) -> tuple[list[int], list[float]]:
        """The sampled models' sizes and load times, by shadow index, as the snapshot's specs give them."""
        cfg = snap.config
        specs = [snap.models[k] for k in self.names]
        return [s.size_bytes for s in specs], [load_seconds(s, cfg) for s in specs]

    def _build(self, snap: Snapshot, cfg: PolicyConfig, now: float) -> bool:
        """(Re)build the shadows for this fleet and catalog when either changed: True when it did."""
        gpus = tuple(sorted((g.id, g.total_bytes) for g in snap.gpus if g.alive))
        shape = (gpus, cfg.max_loads_per_gpu)
        if shape == self.shape:
            return False
        self.shape = shape
        # a miniature fleet past SAMPLE_GPUS GPUs: every k-th GPU, and the models whose id hashes below the same
        # share (a model is in or out of the sample whatever the catalog around it)
        rate = min(1.0, SAMPLE_GPUS / len(gpus)) if gpus else 1.0
        step = len(gpus) / SAMPLE_GPUS if rate < 1.0 else 1.0
        gpus = tuple(gpus[int(i * step)] for i in range(min(len(gpus), SAMPLE_GPUS))) if rate < 1.0 else gpus
        self.names = [k for k in self._ids if rate >= 1.0 or zlib.crc32(k.encode()) < rate * 2**32]
        self.index = {k: i for i, k in enumerate(self.names)}
        self.rate = rate
        sizes, loads = self._specs(snap)
        self.shadows = {name: ShadowFleet(RULES[name](), [b for _g, b in gpus], sizes, loads, cfg.max_loads_per_gpu)
                        for name in WHOLE_EXPERTS}
        self.cold = dict.fromkeys(WHOLE_EXPERTS, 0.0)
        self.real = 0.0
        self.requests = 0.0
        self._new_long()
        self.age = 0.0
        self.adopted = None
        self.since = None
        self.probation = None
        self.held = {}
        # the shadows' clock starts at 0 now: an epoch's seconds (~1.8e9) keep only ~1e-7 s of precision, which a
        # load's last step on a shared link can fall below (its completion would then never come)
        self.origin = now
        return True

    def feed(self, snap: Snapshot, now: float, arrivals: Sequence[Arrival]) -> None:
        """The requests since the last call, into the shadows and the records."""
        cfg = snap.config
        self._catalog(snap)
        if self._build(snap, cfg, now):
            arrivals = ()  # new shadows start empty now: a backlog (a new leader's first call reads an hour)
            if self.leader != HOME:  # a new catalog or fleet: the expert's rule indexed the old one, its record is gone
                self._home()
                self.moves.append((now, HOME))
        if self.at is not None and now > self.at:
            f = 0.5 ** ((now - self.at) / cfg.expert_halflife_s)
            self.real *= f
            self.requests *= f
            for k in self.cold:
                self.cold[k] *= f
            self.age += (now - self.at) / cfg.expert_halflife_s
            f = 0.5 ** ((now - self.at) / (LONG_HALFLIVES * cfg.expert_halflife_s))
            self.long_real *= f
            for k in self.long_cold:
                self.long_cold[k] *= f
                self.long_worse[k] *= f
                self.long_better[k] *= f
        self.at = now if self.at is None else max(self.at, now)
        if self.since is None:
            self.since = now
        index = self.index
        shadows = list(self.shadows.values())
        self.delay = snap.demand_delay_s
        for sh in shadows:  # the live fleet's delay before a demand load, which a shadow's specs do not show
            sh.delay = self.delay
        got: list[tuple[int, int]] = []
        for model, second, count in sorted(arrivals, key=lambda a: a[1]):
            m = index.get(model)
            if m is None or count <= 0:
                continue
            got.append((m, count))
            t = second + 0.5 - self.origin  # as baselines.live: a request of second s came within [s, s + 1)
            for sh in shadows:
                for _ in range(count):
                    sh.request(t, m)
        for sh in shadows:
            sh.advance(now - self.origin)
        if not got:
            return
        ready = ready_models(snap)
        names = self.names
        warm = [names[m] in ready for m, _c in got]
        real = sum(c for (_m, c), w in zip(got, warm, strict=True) if not w)
        self.real += real
        self.long_real += real
        cold: dict[str, float] = {}
        for name, sh in self.shadows.items():  # each shadow's readiness read once: its cold requests and the pairs
            n = worse = better = 0.0
            for (m, c), w in zip(got, warm, strict=True):
                if sh.ready(m):
                    if not w:
                        worse += c
                else:
                    n += c
                    if w:
                        better += c
            cold[name] = n
            self.cold[name] += n
            self.long_cold[name] += n
            self.long_worse[name] += worse
            self.long_better[name] += better
        if self.probation is not None:
            self.trial_real += real
            self.trial_cold += cold[self.probation]
        if self.leader != HOME:
            held = self.held.setdefault(self.leader, [0.0, 0.0])
            held[0] += real
            held[1] += cold[self.leader]
        self.requests += sum(c for _m, c in got)

    def best(self, now: float, halflife_s: float) -> str | None:
        """The expert whose shadow leads the real fleet by the margin, if any. The fleet and the shadows all
        start cold (every first request is cold everywhere), so a record younger than a half-life is no lead."""
        if self.real < MIN_COLD * self.rate or not self.cold or self.since is None or now - self.since < halflife_s:
            return None
        charged = {k: v * self.overhead(k) for k, v in self.cold.items()}
        name = min(charged, key=lambda k: (charged[k], k))
        return name if charged[name] < (1.0 - MARGIN) * self.real else None

    def _new_long(self) -> None:
        self.long_real = 0.0
        self.long_cold = dict.fromkeys(self.shadows, 0.0)
        self.long_worse = dict.fromkeys(self.shadows, 0.0)
        self.long_better = dict.fromkeys(self.shadows, 0.0)

    def sparse(self) -> bool:
        """Cold requests are sparse as a rule: the real fleet's, per half-life on average over the long record, are
        fewer than the recent record needs (each record's decayed sum of a steady pace is the pace times the integral
        of its decay over the time fed)."""
        long_span = LONG_HALFLIVES * -math.expm1(-self.age * math.log(2.0) / LONG_HALFLIVES)
        short_span = -math.expm1(-self.age * math.log(2.0))
        return self.long_real * short_span < MIN_COLD * self.rate * long_span

    def _ahead(self) -> str | None:
        """The whole expert whose shadow the long record finds ahead of the real fleet, by MARGIN and LONG_Z both."""
        if not self.long_cold or self.long_real < MIN_LONG * self.rate:
            return None
        charged = {k: v * self.overhead(k) for k, v in self.long_cold.items()}
        name = min(charged, key=lambda k: (charged[k], k))
        worse, better = self.long_worse[name], self.long_better[name]
        if charged[name] >= (1.0 - MARGIN) * self.long_real or worse - better < LONG_Z * math.sqrt(worse + better):
            return None
        return name

    def _course_worse(self) -> bool:
        """The adopted order did worse than the plan's own before it: the real fleet's cold requests since, against
        the adopted expert's shadow's times their ratio when it was adopted (the shadow is the yardstick that takes
        the traffic's own changes out), above it by MARGIN and GIVE_BACK_Z standard deviations (Poisson) both."""
        assert self.adopted is not None
        if self.long_real < MIN_LONG * self.rate:
            return False
        expected = self.yardstick * self.long_cold[self.adopted] * self.overhead(self.adopted)
        return self.long_real > (1.0 + MARGIN) * expected and \
            self.long_real - expected >= GIVE_BACK_Z * math.sqrt(max(expected, 1.0))

    def long_verdict(self, standing: str | None, trial: bool = False) -> tuple[str, bool] | None:
        """Sparse traffic, while prewarm plans: (expert, True) where a whole expert's shadow is ahead on the long
        record, so its order (ORDER_OF) should lead the plan; (expert, False) where the order adopted so did worse on
        its course and should be given back; None: nothing to do. `standing`: the inner order adopted on this record
        that still stands (Experts.adopted_order); `trial`: a short-record trial runs on top of it, and its course is
        judged once the trial ends. The caller reports what it did with `took`."""
        if self.adopted is not None and ORDER_OF[self.adopted] != standing:
            self.adopted = None  # the plan's own record moved the lead since
        if self.leader != HOME or not self.sparse():
            return None
        if self.adopted is not None:
            return (self.adopted, False) if not trial and self._course_worse() else None
        name = self._ahead()
        return None if name is None else (name, True)

    def took(self, name: str | None) -> None:
        """The plan's lead is now whole expert `name`'s order (None: its own, or what it was) on the long record's
        verdict: the record starts again, to judge what follows against that expert's shadow at their ratio until
        now."""
        if name is not None:
            self.yardstick = self.long_real / max(self.long_cold[name] * self.overhead(name), 1.0)
        self.adopted = name
        self._new_long()

    def overhead(self, name: str) -> float:
        """What the real fleet pays over expert `name`'s shadow while that expert plans it: its cold requests over
        the shadow's in the expert's holds (at least 1; 1 until the shadow has HOLD_COLD of them there)."""
        real, shadow = self.held.get(name, (0.0, 0.0))
        return max(1.0, real / shadow) if shadow >= HOLD_COLD * self.rate else 1.0

    # ---- the plan -------------------------------------------------------------------------------
    def decide(self, snap: Snapshot, now: float, arrivals: Sequence[Arrival]) -> list[Action] | None:
        """The leading expert's actions, or None: prewarm's plan decides this call."""
        cfg = snap.config
        if not (cfg.no_regret and cfg.whole_experts):
            return None
        self.feed(snap, now, arrivals)
        if not self.eligible:
            if self.leader != HOME:
                self.moves.append((now, HOME))
            self._home()
            return None
        if self.leader != HOME and now >= self.until:
            # probation: prewarm plans again, its cold requests counted from now beside the expert's shadow's
            self.probation, self.trial_real, self.trial_cold, self.trial_since = self.leader, 0.0, 0.0, now
            self._home()
            self.moves.append((now, HOME))
        name = self.best(now, cfg.expert_halflife_s)
        if self.probation is not None and self.leader == HOME and self._settled(snap, self.probation):
            if self.trial_real >= PROBATION_COLD * self.rate:
                if self.trial_real > self.trial_cold * self.overhead(self.probation):
                    name = self.probation  # prewarm fell behind the expert's shadow again: it plans again
                self.probation = None
            elif now - self.trial_since >= cfg.expert_halflife_s:
                self.probation = None  # too few cold requests to tell: the records decide from here
        if self.leader == HOME and name is None:
            return None
        if name is not None and name != self.leader and not self._settled(snap, name):
            if self.leader == HOME:
                return None
            name = self.leader
        if name is not None and name != self.leader:
            # prewarm's plan, or an expert that leads the fleet to worse than another's shadow: that one plans
            hold = self.hold.get(name, 0.0)
            hold = HOLD_HALFLIVES * cfg.expert_halflife_s if hold == 0.0 else 2 * hold
            self.hold[name] = hold
            self.leader, self.until = name, now + hold
            self.baseline = BaselinePolicy(name, RULES[name](), cfg)
            self.switches += 1
            self.moves.append((now, name))
        assert self.baseline is not None
        why = self.why()
        return [replace(a, reason=f"{a.reason}; {why}") for a in self.baseline.decide(snap, now, arrivals)]

    def _settled(self, snap: Snapshot, name: str) -> bool:
        """Whether the plan may change hands to `name` now: the real fleet's backlog (models whose requests wait
        with no replica) is no larger than `name`'s shadow's, plus the loads the fleet can start at once. A new
        leader's first call places its whole inherited backlog, each placement evicting; past the free load slots
        those loads queue while their victims are already gone. Handed over mid-burst, on/off × 4 seed 1 had 931
        cold starts in the next 7 minutes where LRU alone had 540 and prewarm's plan alone 450."""
        if not snap.waiting:
            return True
        routable = {r.model for r in snap.replicas if r.state in ROUTABLE}
        backlog = sum(1 for k in snap.waiting if k in self.index and k not in routable)
        slots = snap.config.max_loads_per_gpu
        if backlog == 0 or not slots:  # no slot limit (0): no load queues
            return True
        in_flight = sum(1 for r in snap.replicas if r.state in IN_FLIGHT)
        free_slots = max(0, slots * sum(1 for g in snap.gpus if g.alive) - in_flight)
        return backlog <= len(self.shadows[name].stalled) + free_slots

    def _home(self) -> None:
        self.leader = HOME
        self.baseline = None

    def why(self) -> str:
        if self.leader == HOME:
            return f"prewarm plans: {self._figures()}"
        return (f"whole expert {self.leader} plans for another {fmt_s(self.hold_left())}: it took over when its shadow fleet had "
                f"{MARGIN:.0%} fewer cold requests than this fleet (now {self._figures()})")

    def hold_left(self) -> float:
        """Seconds left of the leading expert's hold, from the last call (live, `until` is an epoch's seconds)."""
        return max(0.0, self.until - (self.at or 0.0))

    def _figures(self) -> str:
        shadows = ", ".join(f"{k} {v:.0f}" + (f" (charged x{self.overhead(k):.2f}: its fleet's overhead)"
                                              if self.overhead(k) > 1.0 else "")
                            for k, v in sorted(self.cold.items()))
        delay = f" (each load {self.delay:.1f} s after its request, as the fleet's)" if self.delay > 0.0 else ""
        return f"decayed cold requests: fleet {self.real:.0f}, shadows {shadows}{delay}"

    def describe(self) -> dict[str, Any]:
        return {"leader": self.leader, "switches": self.switches,
                "hold_left_s": round(self.hold_left()) if self.leader != HOME else 0,
                "moves": [(round(t / 3600, 2), who) for t, who in self.moves],  # (hour, who plans from then)
                "real_cold": round(self.real, 2),
                "shadow_cold": {k: round(v, 2) for k, v in self.cold.items()},
                "overhead": {k: round(self.overhead(k), 3) for k in self.cold},
                "long": {"sparse": self.sparse(), "adopted": self.adopted, "real_cold": round(self.long_real, 2),
                         "shadow_cold": {k: round(v, 2) for k, v in self.long_cold.items()},
                         # (requests the real fleet served cold and the shadow warm, and the reverse)
                         "apart": {k: [round(self.long_worse[k], 2), round(self.long_better[k], 2)]
                                   for k in self.long_cold}},
                "requests": round(self.requests, 2), "eligible": self.eligible, "delay_s": round(self.delay, 3)}
