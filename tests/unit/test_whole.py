"""Whole experts (prewarm.domain.whole, issue 26): whole baselines on shadow fleets beside the real one, and
the plan handed to one while its shadow leads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from prewarm.domain.baselines import RULES
from prewarm.domain.baselines.shadow import ShadowFleet
from prewarm.domain.choice import PrewarmPolicy
from prewarm.domain.policy import GpuState, ModelSpec, PolicyConfig, ReplicaState, Snapshot, TrafficHistory
from prewarm.domain.policy.duels import Trial
from prewarm.domain.states import LOADING, READY
from prewarm.domain.whole import HOME, WholeExperts
from simulator import synthetic
from simulator.engine import Simulation
from simulator.policies import Prewarm
from simulator.trace import GIB, load_profile, read_trace

from .test_sim import trace


@pytest.mark.parametrize("name", ["on-demand-lru", "faascache"])
def test_a_shadow_fleet_is_the_simulators_baseline(name: str) -> None:
    """Fed the requests one by one, a shadow has the cold requests the simulator's run of the same baseline has
    (saturated random traffic: loads queue for slots, share links, and misses stall)."""
    rng = np.random.default_rng(3)
    names = [f"m{i}" for i in range(15)]
    events = sorted((float(t), names[int(i)]) for t, i in zip(rng.uniform(0, 900, 600), rng.integers(0, 15, 600),
                                                              strict=True))
    tr = trace(events)
    sizes = [int(float(s) * GIB) for s in rng.uniform(0.5, 3.0, len(tr.models))]
    loads = [float(x) for x in rng.uniform(5, 60, len(tr.models))]
    sim = Simulation(tr, np.array(sizes, dtype=np.int64), np.array(loads), 2, 4 * GIB, "shared")
    sim.run(RULES[name]())
    sh = ShadowFleet(RULES[name](), [4 * GIB, 4 * GIB], sizes, loads, 2)
    warm = [sh.request(t, m) for t, m in zip(tr.times.tolist(), tr.mids.tolist(), strict=True)]
    assert sh.cold == sim.cold == warm.count(False) and sim.cold > 100


def _run(d: Path, gpus: int, whole: bool, stale_rate: str = "auto") -> Prewarm:
    tr = read_trace(str(d / "requests.csv"), "requests", 0, None)
    sizes, loads = load_profile(str(d / "profile.csv"), tr.models)
    sim = Simulation(tr, sizes, loads, gpus, 80 * GIB, "shared")
    pol = Prewarm(PolicyConfig(whole_experts=whole, refute_stale_rate=stale_rate))
    sim.run(pol)
    pol.cold = sim.cold  # type: ignore[attr-defined]
    return pol


def test_on_bursty_traffic_over_a_small_fleet_lru_takes_over_and_the_fleet_gains(tmp_path: Path) -> None:
    """Synthetic on/off bursts, 6 h on 4 GPUs: on-demand LRU's shadow leads prewarm's fleet, takes over within 5 h
    (at 4.7 h; before the link wait made prewarm's own plan better here, within 4 h), and the fleet ends with fewer
    cold starts than prewarm's plan alone has (3,096 against 3,459). With a stopped stream's measured rate kept
    (refute_stale_rate off): on this traffic the default's record of silences refutes it, and prewarm's plan alone
    then does better than the hand-over did (test_silences; docs/simulation.md, "A stopped stream's rate, chosen at
    run time")."""
    synthetic.write("onoff", tmp_path, hours=6, requests=37_500, seed=0)
    on, off = _run(tmp_path, 4, True, "off"), _run(tmp_path, 4, False, "off")
    moves = on.policy.whole.moves
    assert moves and moves[0][1] == "on-demand-lru" and moves[0][0] <= 5 * 3600
    assert on.cold < off.cold  # type: ignore[attr-defined]
    assert off.policy.whole.moves == [] and off.policy.whole.shadows == {}  # off: no shadow runs
    auto = _run(tmp_path, 4, True)  # the default: 2,209, nothing handed over
    assert auto.policy.whole.moves == [] and auto.cold < on.cold  # type: ignore[attr-defined]


def test_where_prewarm_leads_its_plan_decides_every_call(tmp_path: Path) -> None:
    """Periodic timers over a Poisson background, 6 h on 8 GPUs: no shadow comes near prewarm's fleet, nothing is
    handed over, and every decision is the plan's alone (the same cold starts as with the layer off)."""
    synthetic.write("periodic", tmp_path, hours=6, requests=37_500, seed=0)
    on, off = _run(tmp_path, 8, True), _run(tmp_path, 8, False)
    w = on.policy.whole
    assert w.moves == [] and w.leader == HOME and all(c > w.real for c in w.cold.values())
    assert on.cold == off.cold  # type: ignore[attr-defined]


def _snapshot(models: dict[str, ModelSpec], tr: TrafficHistory) -> Snapshot:
    gpus = (GpuState("n/cuda:0", "n", 4 * GIB, 3 * GIB),)
    replicas = (ReplicaState("a", "n/cuda:0", READY, GIB, 0.0),)
    return Snapshot(models, gpus, replicas, tr, waiting={"b": 1}, config=PolicyConfig())


def test_an_expert_that_leads_plans_and_says_why_and_floors_keep_prewarms_plan() -> None:
    models = {"a": ModelSpec("a", GIB, load_seconds=5.0), "b": ModelSpec("b", GIB, load_seconds=5.0)}
    tr = TrafficHistory.for_config(PolicyConfig())
    w = WholeExperts()
    assert w.decide(_snapshot(models, tr), 0.0, [("b", 0.0, 1)]) is None  # a young record leads nothing
    w.real, w.cold = 1000.0, {"on-demand-lru": 10.0, "faascache": 500.0}
    actions = w.decide(_snapshot(models, tr), 7200.0, [("b", 7199.0, 1)])
    assert actions is not None and w.leader == "on-demand-lru" and w.moves == [(7200.0, "on-demand-lru")]
    [load] = actions
    assert load.model == "b" and "whole expert on-demand-lru plans for another 4.0 h" in load.reason
    assert w.describe()["hold_left_s"] == 4 * 3600
    pinned = {**models, "a": ModelSpec("a", GIB, load_seconds=5.0, pinned=True)}  # a floor: not a baseline's rule
    assert w.decide(_snapshot(pinned, tr), 7300.0, [("b", 7299.0, 1)]) is None
    assert w.leader == HOME and not w.eligible and w.moves[-1] == (7300.0, HOME)


def test_shadows_keep_time_at_an_epochs_scale_and_skip_a_new_leaders_backlog() -> None:
    """Live, `now` is ~1.8e9 s: the shadows count from their own start (a shared link's last step below an epoch's
    ~1e-7 s precision once left a load that never finished). The first call's arrivals (a backlog a new leader
    reads) are not fed; later ones are, and a load started by one finishes."""
    models = {m: ModelSpec(m, GIB, load_seconds=7.3) for m in ("a", "b", "c")}
    tr = TrafficHistory.for_config(PolicyConfig())
    w = WholeExperts()
    t0 = 1_800_000_000.123
    assert w.decide(_snapshot(models, tr), t0, [("b", t0 - 100.0, 5)]) is None
    assert all(sh.requests == 0 for sh in w.shadows.values())  # the backlog
    w.decide(_snapshot(models, tr), t0 + 1.0, [("b", t0, 1), ("c", t0 + 0.3, 1)])
    w.decide(_snapshot(models, tr), t0 + 30.0, [])
    for sh in w.shadows.values():  # both loads shared one link, 7.3 s each alone: done by now
        assert sh.requests == 2 and sh.ready(w.index["b"]) and sh.ready(w.index["c"])


def test_a_new_catalog_hands_the_plan_back_and_starts_the_records_again() -> None:
    models = {"a": ModelSpec("a", GIB, load_seconds=5.0), "b": ModelSpec("b", GIB, load_seconds=5.0)}
    tr = TrafficHistory.for_config(PolicyConfig())
    w = WholeExperts()
    w.decide(_snapshot(models, tr), 0.0, [])
    w.real, w.cold = 1000.0, {"on-demand-lru": 10.0, "faascache": 500.0}
    assert w.decide(_snapshot(models, tr), 7200.0, [("b", 7199.0, 1)]) is not None and w.leader == "on-demand-lru"
    grown = {**models, "c": ModelSpec("c", GIB, load_seconds=5.0)}  # the expert's rule indexed the old catalog
    assert w.decide(_snapshot(grown, tr), 7202.0, [("c", 7201.0, 1)]) is None
    assert w.leader == HOME and w.real == 0.0 and "c" in w.index and w.moves[-1] == (7202.0, HOME)


def _handed_to_lru() -> tuple[WholeExperts, dict[str, ModelSpec], TrafficHistory]:
    """Whole experts whose LRU shadow led by far at 2 h: LRU plans from 7200 s."""
    models = {"a": ModelSpec("a", GIB, load_seconds=5.0), "b": ModelSpec("b", GIB, load_seconds=5.0)}
    tr = TrafficHistory.for_config(PolicyConfig())
    w = WholeExperts()
    w.decide(_snapshot(models, tr), 0.0, [])
    w.real, w.cold = 1000.0, {"on-demand-lru": 10.0, "faascache": 500.0}
    w.decide(_snapshot(models, tr), 7200.0, [])
    return w, models, tr


@pytest.mark.parametrize(("fleet", "shadow", "who"), [(60.0, 10.0, "on-demand-lru"), (60.0, 80.0, HOME)])
def test_a_probation_hands_back_at_once_when_prewarm_falls_behind(fleet: float, shadow: float, who: str) -> None:
    """After an expert's hold prewarm plans on probation; once its fleet has PROBATION_COLD cold requests the
    expert plans again (for twice the hold) if its shadow had fewer in the same span, else prewarm keeps the plan."""
    w, models, tr = _handed_to_lru()
    assert w.leader == "on-demand-lru" and w.until == 7200.0 + 4 * 3600
    w.real, w.cold = 100.0, {"on-demand-lru": 95.0, "faascache": 500.0}  # no margin either way now
    assert w.decide(_snapshot(models, tr), w.until, []) is None and w.leader == HOME and w.probation == "on-demand-lru"
    w.trial_real, w.trial_cold = fleet, shadow
    w.decide(_snapshot(models, tr), w.until + 600.0, [])
    assert w.leader == who and w.probation is None
    if who != HOME:
        assert w.until == 7200.0 + 4 * 3600 + 600.0 + 8 * 3600  # the hold doubled


def test_the_shadows_load_at_the_measured_load_times_after_the_measured_delay() -> None:
    """A new snapshot's specs (live: a measured load time in place of the default from the size) reach the shadows:
    their next loads take the measured time; and so does the fleet's measured delay before a demand load."""
    tr = TrafficHistory.for_config(PolicyConfig())
    w = WholeExperts()
    w.decide(_snapshot({"a": ModelSpec("a", GIB), "b": ModelSpec("b", GIB)}, tr), 0.0, [])
    assert all(sh.delay == 0.0 for sh in w.shadows.values())
    measured = {"a": ModelSpec("a", GIB, load_seconds=42.0), "b": ModelSpec("b", GIB, load_seconds=7.0)}
    w.decide(dataclasses.replace(_snapshot(measured, tr), demand_delay_s=3.5), 1.0, [])
    for sh in w.shadows.values():
        assert sh.load_s[w.index["a"]] == 42.0 and sh.load_s[w.index["b"]] == 7.0 and sh.delay == 3.5


def test_a_shadow_pays_the_fleets_delay_before_a_load_with_its_link_free() -> None:
    """Live, a cold request waits for a wake-up, a tick and a worker before its load starts (measured:
    Snapshot.demand_delay_s). A shadow's replica turns ready that long after its load's last byte, cold to the
    requests meanwhile; its link is free for the next load from that byte on. With no delay (the simulator) it is
    ready when its load ends."""
    for delay, cold in ((0.0, 2), (10.0, 4)):
        sh = ShadowFleet(RULES["on-demand-lru"](), [4 * GIB], [GIB, GIB], [5.0, 5.0], 2)
        sh.delay = delay
        warm = [sh.request(t, m) for t, m in ((0.0, 0), (6.0, 1), (8.0, 0), (20.5, 1), (21.5, 1), (30.0, 0))]
        assert sh.cold == cold and warm[-2:] == [True, True]
        # loaded alone on the link (0-5 s, 6-11 s): ready at 5 and 11 s, or 15 and 21 s
        assert warm[2] == (delay == 0.0) and warm[3] == (delay == 0.0)


@pytest.mark.parametrize("name", ["on-demand-lru", "faascache"])
def test_an_expert_planning_the_fleet_is_the_simulators_baseline(name: str, monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """An expert planning the real fleet (from the start, for good) has the cold starts the simulator's run of its
    baseline has: its rule places a miss that found no room when a load finishes, so a finished load wakes the
    planner for it (`wakes_on_ready`), as the rule's event comes at that instant in the simulator. Synthetic on/off
    bursts on 4 saturated GPUs; without the wake-up the stalled misses waited for the next tick."""
    monkeypatch.setattr(WholeExperts, "best", lambda self, now, halflife_s: name)
    synthetic.write("onoff", tmp_path, hours=3, requests=20_000, seed=1)
    led = _run(tmp_path, 4, True)
    assert led.policy.whole.leader == name and led.policy.wakes_on_ready()
    tr = read_trace(str(tmp_path / "requests.csv"), "requests", 0, None)
    sizes, loads = load_profile(str(tmp_path / "profile.csv"), tr.models)
    sim = Simulation(tr, sizes, loads, 4, 80 * GIB, "shared")
    sim.run(RULES[name]())
    assert led.cold == sim.cold  # type: ignore[attr-defined]
    assert not PrewarmPolicy(PolicyConfig()).wakes_on_ready()  # prewarm's own plan waits for its tick


def test_an_experts_shadow_is_charged_its_fleets_overhead_measured_while_it_plans() -> None:
    """Live, a cold start has delays a shadow does not model. While an expert plans, the fleet's cold requests and
    its shadow's are summed; once the shadow has HOLD_COLD there, their ratio (at least 1) multiplies the shadow's
    record in the takeover and in a probation's verdict."""
    w, models, tr = _handed_to_lru()
    assert w.leader == "on-demand-lru"
    w.decide(_snapshot(models, tr), 7210.0, [("b", 7209.0, 3)])  # cold in both: the shadow loads b (5 s)
    w.decide(_snapshot(models, tr), 7300.0, [("b", 7299.0, 2)])  # the shadow has b ready; the fleet still not
    assert w.held["on-demand-lru"] == [5.0, 3.0] and w.overhead("on-demand-lru") == 1.0  # too few to charge
    w.held["on-demand-lru"] = [100.0, 50.0]
    assert w.overhead("on-demand-lru") == 2.0 and "charged x2.00" in w.why()
    # a probation: prewarm's fleet has 60 cold requests against the shadow's 40, charged 80: prewarm keeps the plan
    w.real, w.cold = 100.0, {"on-demand-lru": 95.0, "faascache": 500.0}
    w.decide(_snapshot(models, tr), w.until, [])
    assert w.leader == HOME and w.probation == "on-demand-lru"
    w.trial_real, w.trial_cold = 60.0, 40.0
    w.decide(_snapshot(models, tr), w.until + 600.0, [])
    assert w.leader == HOME and w.probation is None
    # the records: the shadow's 60 against the fleet's 100 leads by the margin; charged, 120 does not
    w.real, w.cold = 100.0, {"on-demand-lru": 60.0, "faascache": 500.0}
    assert w.best(w.until + 700.0, 3600.0) is None
    w.held["on-demand-lru"] = [40.0, 100.0]  # a fleet better than its shadow is not credited: the charge is 1
    assert w.overhead("on-demand-lru") == 1.0 and w.best(w.until + 700.0, 3600.0) == "on-demand-lru"


def test_the_plan_changes_hands_only_once_the_new_leaders_first_call_can_start_the_backlog() -> None:
    """A new leader's first call places every model whose requests wait with no replica, each placement evicting.
    While that backlog is larger than the leader's shadow's plus the fleet's free load slots (those loads would
    queue, their victims gone already) the plan stays where it is; once it is not, the leader takes over."""
    models = {m: ModelSpec(m, GIB, load_seconds=5.0) for m in "abcdef"}
    tr = TrafficHistory.for_config(PolicyConfig())
    w = WholeExperts()

    def snap(waiting: str, loading: str = "") -> Snapshot:
        replicas = (ReplicaState("a", "n/cuda:0", READY, GIB, 0.0),
                    *(ReplicaState(m, "n/cuda:0", LOADING, GIB, 0.0) for m in loading))
        return dataclasses.replace(_snapshot(models, tr), replicas=replicas, waiting=dict.fromkeys(waiting, 1))

    w.decide(snap(""), 0.0, [])
    w.real, w.cold = 1000.0, {"on-demand-lru": 10.0, "faascache": 500.0}  # LRU's shadow leads by far
    assert w.decide(snap("bcd"), 7200.0, []) is None and w.leader == HOME  # 3 waiting, 2 slots free
    assert w.decide(snap("bc", loading="d"), 7201.0, []) is None and w.leader == HOME  # 2 waiting, 1 slot free
    assert w.decide(snap("ab"), 7202.0, []) is not None  # a is ready: only b waits with no replica
    assert w.leader == "on-demand-lru" and w.moves == [(7202.0, "on-demand-lru")]


def _sparse(w: WholeExperts, real: float, lru: float, apart: tuple[float, float]) -> None:
    """A long record of sparse traffic: 200 half-lives fed, the real fleet's cold requests and LRU's shadow's, and
    (cold on the fleet and warm on LRU's shadow, the reverse); FaasCache's shadow well behind."""
    w.age = 200.0
    w.long_real, w.long_cold = real, {"on-demand-lru": lru, "faascache": 2 * real}
    w.long_worse, w.long_better = {"on-demand-lru": apart[0], "faascache": 0.0}, {"on-demand-lru": apart[1],
                                                                                 "faascache": real}


def test_on_sparse_traffic_the_long_record_lends_the_plan_lrus_order_and_judges_its_course() -> None:
    """Cold requests hours apart never fill the recent record (MIN_COLD). Over a week-long record, where LRU's
    shadow served warm what the fleet served cold by MARGIN and LONG_Z (McNemar), prewarm's plan takes LRU's order
    (recency) rather than handing the fleet over; it is given back where the fleet then does worse against the same
    shadow than before, by GIVE_BACK_Z."""
    models = {"a": ModelSpec("a", GIB, load_seconds=5.0), "b": ModelSpec("b", GIB, load_seconds=5.0)}
    tr = TrafficHistory.for_config(PolicyConfig())
    w = WholeExperts()
    w.decide(_snapshot(models, tr), 0.0, [])
    _sparse(w, 40.0, 20.0, (12.0, 6.0))  # 2x fewer, but 6 of 18 apart: 1.4 sd
    assert w.sparse() and w.long_verdict(None) is None
    _sparse(w, 40.0, 20.0, (25.0, 5.0))  # 3.7 sd
    assert w.long_verdict(None) == ("on-demand-lru", True)
    _sparse(w, 20.0, 10.0, (25.0, 5.0))  # fewer than MIN_LONG cold requests on record: too few to say
    assert w.long_verdict(None) is None
    _sparse(w, 40_000.0, 20_000.0, (25_000.0, 5_000.0))  # busy: the recent record judges (and hands over)
    assert not w.sparse() and w.long_verdict(None) is None
    _sparse(w, 40.0, 20.0, (25.0, 5.0))
    w.took("on-demand-lru")
    assert w.adopted == "on-demand-lru" and w.yardstick == 2.0 and w.long_real == 0.0  # the record starts again
    assert w.describe()["long"]["adopted"] == "on-demand-lru"
    w.age = 300.0
    w.long_real, w.long_cold["on-demand-lru"] = 50.0, 20.0  # 50 against 40 expected: within 3 sd
    assert w.long_verdict("recency") is None
    w.long_real = 60.0  # 60 against 40: 3.2 sd and 50 % above
    # a short-record trial runs on top of the adopted order: its course is judged once the trial ends
    assert w.long_verdict("recency", trial=True) is None and w.adopted == "on-demand-lru"
    assert w.long_verdict("recency") == ("on-demand-lru", False)
    w.took(None)
    assert w.adopted is None and w.long_real == 0.0
    _sparse(w, 40.0, 20.0, (25.0, 5.0))
    w.took("on-demand-lru")
    assert w.long_verdict(None) is None and w.adopted is None  # the plan's own record moved the lead since


def test_the_policy_takes_the_order_the_long_record_lends_and_gives_it_back() -> None:
    """PrewarmPolicy between the whole experts and the plan: the long record's verdict moves the plan's inner lead
    (Experts.adopt: no trial; Duels.give_back: a ban), and its evictions then say so."""
    models = {"a": ModelSpec("a", GIB, load_seconds=5.0), "b": ModelSpec("b", GIB, load_seconds=5.0)}
    tr = TrafficHistory.for_config(PolicyConfig())
    pol = PrewarmPolicy(PolicyConfig())
    pol.decide(_snapshot(models, tr), 0.0, [])
    pol.decide(_snapshot(models, tr), 60.0, [])
    ex = pol.state.experts
    assert ex.leader == "prewarm"
    _sparse(pol.whole, 40.0, 20.0, (25.0, 5.0))
    pol.decide(_snapshot(models, tr), 120.0, [])
    assert ex.leader == "recency" and ex.duels.adopted and ex.duels.trial is None and pol.whole.adopted
    assert "adopted on the whole experts' long record" in ex.why()
    # a short-record trial on top of it: the adoption stands (the trial's candidate may fail back to it)
    ex.duels.trial = Trial("recency", "greedy-dual", 1e9)
    ex.duels.leader = ex.leader = "greedy-dual"
    pol.decide(_snapshot(models, tr), 150.0, [])
    assert ex.leader == "greedy-dual" and ex.adopted_order() == "recency" and pol.whole.adopted == "on-demand-lru"
    ex.duels.trial = None  # the candidate failed: the adopted order leads again
    ex.duels.leader = ex.leader = "recency"
    pol.whole.long_real, pol.whole.long_cold["on-demand-lru"] = 60.0, 20.0
    pol.whole.age = 300.0
    pol.decide(_snapshot(models, tr), 180.0, [])
    assert ex.leader == "prewarm" and ex.duels.banned["recency"] > 180.0 and pol.whole.adopted is None
    _sparse(pol.whole, 40.0, 20.0, (25.0, 5.0))
    pol.decide(_snapshot(models, tr), 240.0, [])  # banned: the verdict is taken, nothing changes
    assert ex.leader == "prewarm" and pol.whole.adopted is None and pol.whole.long_real == 0.0
