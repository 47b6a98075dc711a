"""Partners (prewarm/domain/policy/partners.py): a model that starts is a sign for the models that started with
it before. Hand-built histories and fleets; each case is checked against the same plan with partners off."""

from __future__ import annotations

import dataclasses

from prewarm.domain.policy import (
    GIB,
    Evict,
    PolicyConfig,
    Preload,
    ReplicaState,
    Snapshot,
    TrafficHistory,
    plan,
)

from .test_policy import gpu, spec

ON = PolicyConfig()
OFF = dataclasses.replace(ON, partner_min_count=0)


def history(cfg: PolicyConfig, lead_starts: list[float], follow_starts: list[float], now_start: float) -> TrafficHistory:
    h = TrafficHistory.for_config(cfg)
    for t in sorted([(t, "lead") for t in lead_starts] + [(t, "follow") for t in follow_starts]
                    + [(now_start, "lead")]):
        h.add(t[1], t[0])
    return h


def preloads(cfg: PolicyConfig, h: TrafficHistory, now: float, replicas: tuple[ReplicaState, ...] = (),
             gib: float = 10.0, gpus: int = 2) -> list:
    """plan() on `gpus` GPUs of `gib` each (a speculative load needs a GPU whose link no other load takes:
    the leader's own demand load takes one), `replicas` on the first."""
    models = {m.id: m for m in (spec("lead", 1), spec("follow", 2), spec("other", 2))}
    fleet = []
    for i in range(gpus):
        g = gpu(f"n{i}/cuda:0", gib)
        used = sum(r.bytes for r in replicas if r.gpu == g.id)
        fleet.append(dataclasses.replace(g, free_bytes=g.total_bytes - used))
    return plan(Snapshot(models, tuple(fleet), replicas, h, config=cfg), now)


# irregular gaps (700 s, 2,200 s, then 1,200 s to the leader's new start): no idle-time timeline is hot
LEAD = [0.0, 700.0, 2900.0]
FOLLOW = [20.0, 730.0, 2910.0]  # each within partner_window_s of the leader's start


def test_a_leaders_start_loads_its_partner_ahead() -> None:
    now = 4105.0
    got = [a for a in preloads(ON, history(ON, LEAD, FOLLOW, 4100.0), now) if a.model == "follow"]
    assert [a.kind for a in got] == ["speculative"]
    assert "partner of lead" in got[0].reason and got[0].numbers["p_partner"] == 1.0
    off = preloads(OFF, history(OFF, LEAD, FOLLOW, 4100.0), now)
    assert not [a for a in off if a.model == "follow"]


def test_no_partner_load_once_the_window_has_passed_or_the_partner_came() -> None:
    assert not [a for a in preloads(ON, history(ON, LEAD, FOLLOW, 4100.0), 4100.0 + ON.partner_window_s + 2)
                if a.model == "follow"]
    h = history(ON, LEAD, FOLLOW, 4100.0)
    h.add("follow", 4104.0)  # it came: demand, not a prediction
    assert not [a for a in preloads(ON, h, 4105.0) if a.model == "follow" and a.kind == "speculative"]


def test_a_partner_that_joined_too_few_of_the_leaders_starts_is_not_loaded() -> None:
    lead = [0.0, 700.0, 2900.0, 3500.0, 5000.0]
    assert ON.partner_precision == 0.75
    some = [20.0, 2910.0, 5010.0]  # 3 of 5 starts: 60 %, under partner_precision
    assert not [a for a in preloads(ON, history(ON, lead, some, 6300.0), 6305.0) if a.model == "follow"]
    most = [20.0, 730.0, 2910.0, 5010.0]  # 4 of 5: 80 %
    assert [a.model for a in preloads(ON, history(ON, lead, most, 6300.0), 6305.0) if a.model == "follow"] \
        == ["follow"]


def test_an_expected_partner_is_kept_over_a_replica_with_no_sign() -> None:
    """The GPU holds follow and other (2 GiB each, both idle); a demand load of lead needs one of them
    gone. Other was asked for more recently, so with partners off follow goes; lead's start makes
    follow expected within the window, so other goes instead."""
    def run(cfg: PolicyConfig) -> list[str]:
        h = history(cfg, LEAD, FOLLOW, 4100.0)
        for t in (1500.0, 2000.0, 3300.0):
            h.add("other", t)
        reps = (ReplicaState("follow", "n0/cuda:0", "ready", 2 * GIB, 0.0),
                ReplicaState("other", "n0/cuda:0", "ready", 2 * GIB, 0.0))
        acts = preloads(cfg, h, 4102.0, reps, gib=4.5, gpus=1)
        assert [a.model for a in acts if isinstance(a, Preload)] == ["lead"]
        return [a.model for a in acts if isinstance(a, Evict)]

    assert run(OFF) == ["follow"]
    assert run(ON) == ["other"]


def test_a_kept_state_expects_the_partners_a_fresh_one_does() -> None:
    """partners.expectations keeps each leader's qualifying partners between calls (PolicyState.partners) until
    its starts or its co-start table change (TrafficHistory.co_version): on random starts of a few models, with
    a small partner table that drops singletons, every call expects what a fresh state's call expects."""
    import random

    from prewarm.domain.policy import PolicyState
    from prewarm.domain.policy.partners import expectations
    from prewarm.domain.policy.plan_call import PlanCall

    cfg = dataclasses.replace(ON, partner_min_count=1, partner_precision=0.3, partner_table=3)
    rnd = random.Random(7)
    names = [f"m{i}" for i in range(8)]
    models = {m: spec(m, 1) for m in names}
    h = TrafficHistory.for_config(cfg)
    kept = PolicyState()
    t, seen = 0.0, 0
    for _ in range(400):
        t += rnd.choice((1.0, 5.0, 20.0, cfg.partner_gap_s + 1.0))
        h.add(rnd.choice(names), t)
        snap = Snapshot(models, (gpu("n0/cuda:0", 10),), (), h, config=cfg)
        got = expectations(PlanCall(snap, t + 1.0, kept))
        assert got == expectations(PlanCall(snap, t + 1.0, PolicyState()))
        seen += bool(got)
    assert seen > 20 and len(kept.partners) > 3  # partners were expected, from the memo
    other = TrafficHistory.for_config(cfg)  # a new history: the memo starts again
    other.add("m0", 1.0)
    expectations(PlanCall(Snapshot(models, (gpu("n0/cuda:0", 10),), (), other, config=cfg), 2.0, kept))
    assert kept.partners_key[0] == id(other) and set(kept.partners) <= {"m0"}
