"""Which replicas of a draining node need a home (prewarm.domain.drain, pure)."""

from __future__ import annotations

from prewarm.domain.drain import Demand, Held, needs

A0, A1 = "node-a/cpu:0", "node-a/cpu:1"


def test_a_model_without_demand_needs_no_home() -> None:
    assert needs([Held("quiet", "v1", A0)], {"quiet": Demand()}, {}, {}) == []
    assert needs([Held("unknown", "v1", A0)], {}, {}, {}) == []  # not in the catalog: no demand


def test_pinned_min_replicas_and_traffic_each_want_a_home() -> None:
    held = [Held("pinned", "v1", A0), Held("floor", "v1", A0), Held("floor", "v1", A1), Held("busy", "v1", A1)]
    demand = {"pinned": Demand(pinned=True), "floor": Demand(min_replicas=2), "busy": Demand(recent_traffic=True)}
    got = {n.model: n for n in needs(held, demand, {}, {})}
    assert sorted(got) == ["busy", "floor", "pinned"]
    assert (got["pinned"].homeless, got["pinned"].to_load, got["pinned"].why) == (1, 1, "pinned")
    assert (got["floor"].wanted, got["floor"].homeless, got["floor"].gpus) == (2, 2, (A0, A1))
    assert got["busy"].why == "traffic in the last window" and got["busy"].homeless == 1


def test_replicas_ready_elsewhere_make_up_for_the_draining_ones() -> None:
    held = [Held("floor", "v1", A0), Held("floor", "v1", A1)]
    demand = {"floor": Demand(min_replicas=2)}
    assert needs(held, demand, {("floor", "v1"): 2}, {}) == []
    (one,) = needs(held, demand, {("floor", "v1"): 1}, {})
    assert (one.ready_elsewhere, one.homeless, one.to_load) == (1, 1, 1)
    # a ready replica of another version is not a home for this one
    (other,) = needs([Held("p", "v1", A0)], {"p": Demand(pinned=True)}, {("p", "v2"): 1}, {})
    assert other.homeless == 1


def test_a_load_in_flight_elsewhere_is_a_home_coming_not_a_home() -> None:
    held = [Held("p", "v1", A0)]
    (n,) = needs(held, {"p": Demand(pinned=True)}, {}, {("p", "v1"): 1})
    assert n.homeless == 1 and n.to_load == 0  # nothing more to send, but not yet safe to evict


def test_a_floor_above_the_draining_replicas_asks_only_for_those() -> None:
    # min_replicas 3, one replica on the draining node, none elsewhere: the drain moves the one it holds (the
    # planner keeps the floor itself)
    (n,) = needs([Held("floor", "v1", A0)], {"floor": Demand(min_replicas=3)}, {("floor", "v1"): 0}, {})
    assert n.wanted == 3 and n.homeless == 1 and n.to_load == 1


def test_demand_words() -> None:
    assert Demand(pinned=True, min_replicas=2, recent_traffic=True).why() == \
        "pinned, min_replicas 2, traffic in the last window"
    assert Demand().wanted == 0 and Demand(recent_traffic=True).wanted == 1 and Demand(min_replicas=3).wanted == 3
