"""Issue 26: the loads-ahead record (prewarm.domain.policy.ahead: each load ahead a bet that its model is
asked for before its victims, settled on the real requests; loads ahead held back while they lose, shadows
still judged) and the demand order that counts waiting seconds (steps.demand_weight: no model starves)."""

from __future__ import annotations

from prewarm.domain.policy import Evict, PolicyConfig, Preload, TrafficHistory, plan
from prewarm.domain.policy.ahead import MIN_SCORED, AheadRecord
from prewarm.domain.policy.memo import PolicyState
from tests.unit.test_policy import hourly_world
from tests.unit.test_policy_overdue import NOW, _snap

CFG = PolicyConfig()
HALF = CFG.expert_halflife_s


def one(_m: str) -> float:
    return 1.0  # every reload costs one cold request


def settle(rec: AheadRecord, tr: TrafficHistory, bets: list[tuple[str, str]], first: str, t: float) -> float:
    """Make bets (target, victim) at t, then a request for `first` of each pair at t + 5; feed at t + 10."""
    for target, victim in bets:
        rec.bet(target, (victim,), t, shadow=False, ready=t)
    for target, victim in bets:
        tr.add(target if first == "target" else victim, t + 5.0)
    rec.feed(tr, t + 10.0, HALF, one)
    return t + 10.0


def test_a_bet_is_won_when_its_model_comes_first_and_lost_when_a_victim_does() -> None:
    tr = TrafficHistory.for_config(CFG)
    rec = AheadRecord()
    rec.feed(tr, 0.0, HALF, one)
    settle(rec, tr, [("s1", "v1")], "target", 100.0)
    assert (rec.won, rec.lost, rec.settled) == (1.0, 0.0, 1)
    settle(rec, tr, [("s2", "v2")], "victim", 110.0)
    assert rec.lost == 1.0 and rec.settled == 2 and not rec.bets  # settled bets are closed
    # a request older than the bet says nothing of it
    tr.add("s3", 200.0)
    rec.bet("s3", ("v3",), 300.0, shadow=False, ready=300.0)
    rec.feed(tr, 301.0, HALF, one)
    assert rec.settled == 2 and "s3" in rec.pending


def test_loads_ahead_that_lose_are_held_back_and_shadows_open_the_gate_again() -> None:
    tr = TrafficHistory.for_config(CFG)
    rec = AheadRecord()
    rec.feed(tr, 0.0, HALF, one)
    assert rec.open()  # no record: loads ahead go on
    t = settle(rec, tr, [(f"s{i}", f"v{i}") for i in range(int(MIN_SCORED) + 2)], "victim", 100.0)
    assert not rec.open()
    assert "held back" in rec.why()
    # held back, the policy's picks are shadow bets, one open bet per target
    for i in range(int(MIN_SCORED) * 3):
        rec.bet(f"x{i}", (f"y{i}",), t, shadow=True, ready=t)
    assert not rec.wants("x0")
    for i in range(int(MIN_SCORED) * 3):
        tr.add(f"x{i}", t + 5.0)  # they would have paid: each came before its victim
    rec.feed(tr, t + 10.0, HALF, one)
    assert rec.open() and rec.shadow_total == int(MIN_SCORED) * 3


def test_the_record_forgets_with_the_half_life_and_drops_bets_nobody_settled() -> None:
    tr = TrafficHistory.for_config(CFG)
    rec = AheadRecord()
    rec.feed(tr, 0.0, HALF, one)
    t = settle(rec, tr, [(f"s{i}", f"v{i}") for i in range(8)], "victim", 100.0)
    lost = rec.lost
    rec.bet("late", ("quiet",), t, shadow=False, ready=t)
    rec.feed(tr, t + HALF, HALF, one)
    assert abs(rec.lost - lost / 2) < 1e-9
    rec.feed(tr, t + HALF + 1.0, HALF, one)
    assert "late" not in rec.pending and not rec.bets  # past the horizon, unscored
    assert rec.settled == 8


def test_plan_loads_ahead_while_they_pay_and_not_while_they_lose() -> None:
    """The hourly model of the policy tests is warmed shortly before its hour (idle budget 0): a
    speculative preload that says what loads ahead won. With a record that says they lose, plan() makes
    the same pick as a shadow bet and no preload."""
    for losing in (False, True):
        w, _ = hourly_world(PolicyConfig(idle_memory_budget=0.0))
        t0 = 7 * 3600 + 5.0
        w.run(t0 + 1, t0 + 3600 - 200, None)
        assert w.state is not None
        if losing:
            w.state.ahead.lost = 100.0
        w.run(t0 + 3600 - 200 + CFG.tick_s, t0 + 3600 - 6, None)
        pre = w.preloads("hourly", "speculative")
        if losing:
            assert pre == [] and "hourly" in w.state.ahead.pending and w.state.ahead.shadow_total >= 1
        else:
            assert len(pre) == 1 and "loads ahead on" in pre[0][1].reason
            assert w.state.ahead.pending["hourly"] is not None


def test_a_model_waiting_many_of_its_load_times_outranks_a_busy_one_for_the_last_slot() -> None:
    """One GPU, one load in flight (two slots): one more load goes now. busy (1 GiB, 2 s, 1 request/s)
    and rare (4 GiB, 20 s, no recent traffic) each have a request waiting. By rate alone busy always goes
    first (rare could wait for ever behind a stream of such); with its waiting seconds counted, rare goes
    first once it has waited long enough (here some 600 of its load times)."""
    def first_load(rare_waited: float) -> str:
        # links shared (no link wait): the test is of the order for a free slot
        snap = _snap(PolicyConfig(link_wait=False), [("n1/cuda:0", 16)], [("x", "n1/cuda:0", 1, "loading", NOW - 1)],
                     {"x": (1, 30.0), "busy": (1, 2.0), "rare": (4, 20.0)},
                     {"busy": NOW - 3, "rare": NOW - rare_waited}, traffic={"busy": 1, "x": 1})
        pre = [a for a in plan(snap, NOW) if isinstance(a, Preload)]
        assert len(pre) == 1
        return pre[0].model
    assert first_load(30.0) == "busy"
    assert first_load(1000.0) == "busy"
    assert first_load(20_000.0) == "rare"


def test_loads_ahead_must_save_the_prefetch_margin_times_what_they_cost() -> None:
    """Six bets won, four lost: they pay for themselves (a bar of 1) but not twice over (plan()'s margin)."""
    for margin, open_ in ((1.0, True), (CFG.prefetch_margin, False)):
        tr = TrafficHistory.for_config(CFG)
        rec = AheadRecord()
        rec.feed(tr, 0.0, HALF, one, margin)
        for i in range(10):
            rec.bet(f"s{i}", (f"v{i}",), 100.0, shadow=False, ready=100.0)
            tr.add(f"s{i}" if i < 6 else f"v{i}", 105.0)
        rec.feed(tr, 110.0, HALF, one, margin)
        assert (rec.won, rec.lost) == (6.0, 4.0)
        assert rec.open() is open_


def test_a_bets_link_time_is_charged_when_it_settles_won_lost_or_dropped() -> None:
    tr = TrafficHistory.for_config(CFG)
    rec = AheadRecord()
    rec.feed(tr, 0.0, HALF, one)
    for i in range(5):  # a burst of bets, each holding up 3 requests on its link
        rec.bet(f"s{i}", (f"v{i}",), 100.0, shadow=False, ready=100.0, link=3.0)
    assert rec.lost == 0.0 and rec.open()  # not before anything is known of them
    for i in range(4):
        tr.add(f"s{i}", 105.0)  # won: each saved one reload, and cost its link time
    rec.feed(tr, 110.0, HALF, one)
    assert (rec.won, rec.lost_total) == (4.0, 12.0)
    rec.feed(tr, 100.0 + HALF + 1.0, HALF, one)  # s4 settles by nobody's request: its link time all the same
    assert rec.lost_total == 15.0 and not rec.bets


def test_a_load_ahead_evicted_unused_can_no_longer_win_its_bet() -> None:
    """s was loaded ahead (a bet against its victim v) and never asked for; a demand load of big needs its
    memory, so plan() evicts it. Its bet can now only be lost: a later request for s finds no replica and scores
    no win (before, it did: on ServeGen 72 h × 16 such phantom wins kept the gate open for loads ahead a third of
    which served a request), a return of v still scores the loss. A shadow bet has no replica to lose."""
    snap = _snap(CFG, [("n1/cuda:0", 4)], [("s", "n1/cuda:0", 3, "ready", NOW - 600)],
                 {"s": (3, 2.0), "big": (4, 4.0), "v": (1, 2.0)}, {"big": NOW - 40})
    st = PolicyState()
    st.ahead.feed(snap.traffic, NOW - 700, HALF, one)
    st.ahead.bet("s", ("v",), NOW - 700, shadow=False, ready=NOW - 600)
    st.ahead.bet("w", ("v2",), NOW - 700, shadow=True, ready=NOW - 600)
    acts = [(type(a).__name__, a.model) for a in plan(snap, NOW, st) if isinstance(a, (Evict, Preload))]
    assert acts == [("Evict", "s"), ("Preload", "big")]
    assert "s" not in st.ahead.pending and "w" in st.ahead.pending
    st.ahead.gone("w")  # a shadow's target was never loaded: nothing changes
    assert "w" in st.ahead.pending
    won, lost = st.ahead.won, st.ahead.lost
    snap.traffic.add("s", NOW + 5.0)
    st.ahead.feed(snap.traffic, NOW + 10.0, HALF, one)
    assert st.ahead.won == won and len(st.ahead.bets) == 2  # no win, still open on its victim
    snap.traffic.add("v", NOW + 15.0)
    st.ahead.feed(snap.traffic, NOW + 20.0, HALF, one)
    assert st.ahead.won == won and st.ahead.lost > lost and list(st.ahead.pending) == ["w"]
