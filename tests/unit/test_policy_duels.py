"""The no-regret layer judged on the real fleet (prewarm.domain.policy.duels, issue 26 item 2): each real
eviction against what the other experts' orders would have taken, settled by which comes back first; a new
lead on trial, judged by what its own evictions cost; and plan() following it on hand-built traffic."""

from __future__ import annotations

import numpy as np
import pytest

from prewarm.domain.policy import GIB, PolicyConfig
from prewarm.domain.policy.duels import BAN_HALFLIVES, MIN_SCORED, TRIAL_EVICTIONS, Duels
from simulator.engine import Simulation
from simulator.policies import POLICIES, Prewarm
from simulator.trace import Trace
from tests.unit.test_policy_experts import bursty_and_steady, hot_and_scan

NAMES = ("prewarm", "greedy-dual", "lru")
ON = PolicyConfig(no_regret=True)  # the layer (off by default: PolicyConfig.no_regret says why), judged by duels


def one(_m: str) -> float:
    return 1.0


def test_a_duel_is_settled_by_whichever_side_is_asked_for_first() -> None:
    d = Duels(NAMES)
    # the leader took a and b; lru would have taken b and c: a against c
    d.open("lru", ("a", "b"), ("b", "c"), now=10.0)
    d.request(5.0, "a", 1, one)  # before the eviction: says nothing
    assert d.won["lru"] == d.lost["lru"] == 0.0 and d.duels
    d.request(12.0, "b", 1, one)  # on both sides: not in the duel
    assert d.duels
    d.request(13.0, "a", 1, one)  # the leader's victim came back first: lru would have kept it
    assert d.won["lru"] == 1.0 and d.lost["lru"] == 0.0 and not d.duels
    d.open("greedy-dual", ("a",), ("c",), now=20.0)
    d.request(21.0, "c", 1, one)  # greedy-dual's victim asked for first: it would have lost it
    assert d.lost["greedy-dual"] == 1.0
    d.open("lru", ("a",), ("a",), now=30.0)  # the same choice: no duel
    d.open("prewarm", ("a",), ("c",), now=30.0)  # the leader against itself: none either
    assert not d.duels
    d.open("lru", ("x",), ("y",), now=40.0)
    d.expire(41.0)  # nobody came back within the half-life: dropped, nothing charged
    assert not d.duels and d.won["lru"] == 1.0 and d.lost["lru"] == 0.0


def test_the_lead_moves_only_past_the_margin_and_a_failed_trial_goes_back_and_sits_out() -> None:
    d = Duels(NAMES, halflife=100.0)
    d.won["lru"], d.lost["lru"] = MIN_SCORED * 0.6, MIN_SCORED * 0.3  # 2x, but too little on record
    assert not d.choose(2.0, now=0.0) and d.leader == "prewarm"
    d.won["lru"], d.lost["lru"] = 1.9 * MIN_SCORED, MIN_SCORED  # enough, short of the margin
    assert not d.choose(2.0, now=0.0)
    d.won["lru"] = 2.1 * MIN_SCORED
    # what prewarm's own evictions cost before the switch: 1 returned reload in 100 requests
    d.requests, d.returned = 100.0, 1.0
    assert d.choose(2.0, now=0.0) and d.leader == "lru" and d.trial == ("prewarm", pytest.approx(0.01))
    assert d.won["lru"] == 0.0 and d.requests == 0.0  # a new record for the new lead
    # the trial: lru's evictions cost 5 in 100 requests, worse: back to prewarm, lru sits out
    for i in range(int(TRIAL_EVICTIONS)):
        d.took((f"v{i}",), now=1.0)
    d.requests = 100.0
    for i in range(5):
        d.request(2.0, f"v{i}", 1, one)
    assert d.choose(2.0, now=3.0) and d.leader == "prewarm" and d.reverts == 1
    assert d.banned["lru"] == pytest.approx(3.0 + BAN_HALFLIVES * 100.0)
    d.won["lru"], d.lost["lru"] = 10 * MIN_SCORED, 0.0
    assert not d.choose(2.0, now=4.0)  # banned: its duels do not move the lead


def test_a_trial_that_pays_keeps_the_lead() -> None:
    d = Duels(NAMES)
    d.won["greedy-dual"], d.lost["greedy-dual"] = 3 * MIN_SCORED, MIN_SCORED
    d.requests, d.returned = 100.0, 5.0
    assert d.choose(2.0, now=0.0) and d.leader == "greedy-dual"
    for i in range(int(TRIAL_EVICTIONS)):
        d.took((f"v{i}",), now=1.0)
    for i in range(100):
        d.request(2.0 + i, "hot", 1, one)
    d.request(200.0, "v0", 1, one)  # 1 in 101 requests: cheaper than 5 in 100
    assert not d.choose(2.0, now=201.0) and d.leader == "greedy-dual" and d.trial is None


def simulate(stream: list[tuple[float, str]], gib: int, policy: object) -> Simulation:
    models = sorted({m for _t, m in stream})
    idx = {m: i for i, m in enumerate(models)}
    tr = Trace(models, np.array([t for t, _m in stream]), np.array([idx[m] for _t, m in stream], dtype=np.int32),
               stream[-1][0], "hand-built", "requests")
    sim = Simulation(tr, np.full(len(models), GIB), np.full(len(models), 1.0), 1, gib * GIB, "none")
    sim.run(policy)  # type: ignore[arg-type]
    return sim


def compare(stream: list[tuple[float, str]], gib: int) -> tuple[Prewarm, dict[str, int]]:
    """Cold starts on `stream`: prewarm with the layer on (returned, its record kept) and off, and two baselines."""
    on = Prewarm(ON)
    cold = {"on": simulate(stream, gib, on).cold,
            "off": simulate(stream, gib, Prewarm(PolicyConfig(no_regret=False))).cold}
    for name in ("on-demand-lru", "faascache"):
        cold[name] = simulate(stream, gib, POLICIES[name]()).cold
    return on, cold


def test_where_lru_is_the_best_order_the_layer_follows_it() -> None:
    # bursty_and_steady on 3 GiB (test_policy_experts): greedy-dual keeps the burst's model, prewarm's own
    # value order too; LRU lets it go and keeps the steady three.
    stream = bursty_and_steady()
    on, cold = compare(stream, 3)
    ex = on.state.experts
    assert ex.leader == "lru" and ex.duels.leader == "lru"
    assert cold["on-demand-lru"] < 0.5 * cold["off"]  # LRU is the better order here: 121 against 354
    assert cold["on"] <= 1.25 * cold["on-demand-lru"]  # and the layer gets there (138)
    # within 150 requests: the first half hour alone (150 of the 1,800) already follows it
    head = [x for x in stream if x[0] < 1800]
    early = Prewarm(ON)
    simulate(head, 3, early)
    assert len(head) == 150 and early.state.experts.leader == "lru"


def test_where_its_own_order_is_better_a_lead_that_does_not_pay_goes_back() -> None:
    # hot_and_scan on 5 GiB: LRU wins the one-step duels against prewarm's order, then leading it costs more
    # (a failed trial, reverted); the layer ends within 5 % of the better of prewarm alone and FaasCache.
    on, cold = compare(hot_and_scan(), 5)
    assert on.state.experts.duels.reverts >= 1
    assert cold["on"] <= 1.05 * min(cold["off"], cold["faascache"]) and cold["on"] < cold["on-demand-lru"]
