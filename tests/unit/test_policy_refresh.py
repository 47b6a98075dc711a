"""The policy's priority rule for make-room victims and its refresh of old replicas (issue 14, items 3
and 6), on hand-built snapshots with an injected clock."""

from __future__ import annotations

import math

import pytest

from prewarm.domain.policy import (
    GIB,
    Evict,
    GpuState,
    Keep,
    ModelSpec,
    PolicyConfig,
    PolicyState,
    Preload,
    ReplicaState,
    Snapshot,
    TrafficHistory,
    plan,
)
from prewarm.domain.policy.memo import PolicyState as Memo
from prewarm.domain.policy.plan_call import PlanCall

LOW, NORMAL, HIGH = 0, 1, 2
CFG = PolicyConfig()


def _snap(models: list[ModelSpec], gpus: list[GpuState], replicas: list[ReplicaState]) -> Snapshot:
    return Snapshot({m.id: m for m in models}, tuple(gpus), tuple(replicas), TrafficHistory.for_config(CFG))


def _gpu(gid: str, total: int, replicas: list[ReplicaState], node: str = "n0") -> GpuState:
    used = sum(r.bytes for r in replicas if r.gpu == gid)
    return GpuState(gid, node, total, total - used)


# ---- priority: a speculative load never evicts a higher-priority model's replica ------------------------

def _make_room(resident: int, incoming: int, kind: str) -> list[str] | None:
    """One 10 GiB GPU holding an idle 6 GiB replica of `old` (priority `resident`); place a 5 GiB load of
    `new` (priority `incoming`) of `kind`: the victims' models, or None when it does not go there."""
    models = [ModelSpec("old", 6 * GIB, load_seconds=5.0, priority=resident),
              ModelSpec("new", 5 * GIB, load_seconds=5.0, priority=incoming)]
    reps = [ReplicaState("old", "g0", "ready", 6 * GIB, since=0.0, ready_at=5.0)]
    pl = PlanCall(_snap(models, [_gpu("g0", 10 * GIB, reps)], reps), 1000.0, Memo())
    choice = pl.place(models[1], kind, math.inf)
    return None if choice is None else [r.model for r in choice.victims]


def test_a_speculative_load_does_not_evict_a_higher_priority_replica() -> None:
    assert _make_room(HIGH, LOW, "speculative") is None
    assert _make_room(HIGH, NORMAL, "speculative") is None
    assert _make_room(NORMAL, LOW, "speculative") is None


@pytest.mark.parametrize(("resident", "incoming"), [(NORMAL, NORMAL), (LOW, NORMAL), (LOW, LOW), (HIGH, HIGH),
                                                    (NORMAL, HIGH)])
def test_a_speculative_load_evicts_an_equal_or_lower_priority_replica(resident: int, incoming: int) -> None:
    assert _make_room(resident, incoming, "speculative") == ["old"]


def test_a_demand_load_may_evict_a_higher_priority_replica() -> None:
    assert _make_room(HIGH, LOW, "demand") == ["old"]  # a request waits now: not merely speculative


# ---- refresh by age ----------------------------------------------------------------------------------

AGE = 100.0
SPEC = ModelSpec("m", 4 * GIB, load_seconds=10.0, max_replica_age_s=AGE)
OTHER = ModelSpec("x", 10 * GIB, load_seconds=10.0)


def _refresh(actions: list) -> list[tuple[str, str, str, str]]:
    return [(type(a).__name__, a.model, a.gpu, a.kind) for a in actions]


def test_an_old_replica_gets_a_fresh_one_elsewhere_before_it_is_evicted() -> None:
    old = ReplicaState("m", "g0", "ready", SPEC.size_bytes, since=0.0, ready_at=10.0)
    gpus = [_gpu("g0", 10 * GIB, [old]), _gpu("g1", 10 * GIB, [])]
    # within its age: nothing
    assert plan(_snap([SPEC], gpus, [old]), 10.0 + AGE - 1) == []
    # past it: a fresh replica on the other GPU (the one holding it cannot host two), nothing evicted
    acts = plan(_snap([SPEC], gpus, [old]), 10.0 + AGE + 1)
    assert _refresh(acts) == [("Preload", "m", "g1", "refresh")]
    assert "max_replica_age" in acts[0].reason
    # while it loads: wait (the old one stays; no second load)
    loading = ReplicaState("m", "g1", "loading", SPEC.size_bytes, since=10.0 + AGE + 1)
    gpus2 = [_gpu("g0", 10 * GIB, [old]), _gpu("g1", 10 * GIB, [loading])]
    assert plan(_snap([SPEC], gpus2, [old, loading]), 10.0 + AGE + 5) == []
    # once it is ready: the old one goes
    new = ReplicaState("m", "g1", "ready", SPEC.size_bytes, since=10.0 + AGE + 1, ready_at=10.0 + AGE + 11)
    gpus3 = [_gpu("g0", 10 * GIB, [old]), _gpu("g1", 10 * GIB, [new])]
    acts = plan(_snap([SPEC], gpus3, [old, new]), 10.0 + AGE + 12)
    assert _refresh(acts) == [("Evict", "m", "g0", "refresh")]
    assert "refresh" in acts[0].reason and "g1 is ready" in acts[0].reason


def test_no_room_anywhere_keeps_the_old_replica_and_says_why() -> None:
    old = ReplicaState("m", "g0", "ready", SPEC.size_bytes, since=0.0, ready_at=10.0)
    full = ReplicaState("x", "g1", "ready", OTHER.size_bytes, since=0.0, ready_at=10.0)
    gpus = [_gpu("g0", 10 * GIB, [old]), _gpu("g1", 10 * GIB, [full])]
    acts = plan(_snap([SPEC, OTHER], gpus, [old, full]), 500.0)
    assert _refresh(acts) == [("Keep", "m", "g0", "refresh_blocked")]
    assert isinstance(acts[0], Keep) and "no other GPU" in acts[0].reason
    # a single GPU: the same (two replicas of a model never share a GPU)
    acts = plan(_snap([SPEC], [_gpu("g0", 10 * GIB, [old])], [old]), 500.0)
    assert _refresh(acts) == [("Keep", "m", "g0", "refresh_blocked")]


def test_a_replica_ready_before_the_old_one_went_stale_is_not_its_replacement() -> None:
    """Two replicas (e.g. scaled out): one turns old. The other was there before, so evicting the old one
    would drop the count from 2 to 1: a third loads first."""
    old = ReplicaState("m", "g0", "ready", SPEC.size_bytes, since=0.0, ready_at=10.0)
    peer = ReplicaState("m", "g1", "ready", SPEC.size_bytes, since=50.0, ready_at=60.0)
    gpus = [_gpu("g0", 10 * GIB, [old]), _gpu("g1", 10 * GIB, [peer]), _gpu("g2", 10 * GIB, [])]
    acts = plan(_snap([SPEC], gpus, [old, peer]), 10.0 + AGE + 1)
    assert _refresh(acts) == [("Preload", "m", "g2", "refresh")]


def test_the_ready_count_never_drops_while_replicas_are_refreshed() -> None:
    """Ticks every 2 s for 10 minutes with loads of 10 s and a 100 s age limit on two GPUs: the model is
    replaced again and again, always ready somewhere, never two loads of it at once."""
    reps: dict[str, ReplicaState] = {"g0": ReplicaState("m", "g0", "ready", SPEC.size_bytes, 0.0, ready_at=0.0)}
    state = PolicyState()
    history = TrafficHistory.for_config(CFG)
    refreshed = 0
    for step in range(300):
        now = 2.0 * step
        for g, r in list(reps.items()):
            if r.state == "loading" and now >= r.since + 10.0:
                reps[g] = ReplicaState("m", g, "ready", r.bytes, r.since, ready_at=r.since + 10.0)
        gpus = [_gpu(g, 10 * GIB, list(reps.values())) for g in ("g0", "g1")]
        acts = plan(Snapshot({"m": SPEC}, tuple(gpus), tuple(reps.values()), history), now, state)
        for a in acts:
            if isinstance(a, Evict):
                assert a.kind == "refresh" and reps[a.gpu].state == "ready"
                del reps[a.gpu]
                refreshed += 1
            elif isinstance(a, Preload):
                assert a.kind == "refresh" and a.gpu not in reps
                reps[a.gpu] = ReplicaState("m", a.gpu, "loading", a.bytes, now)
        ready = [r for r in reps.values() if r.state == "ready"]
        assert ready, f"no ready replica at {now}"
        assert all(now - (r.ready_at or 0.0) <= AGE + 2 * 10.0 + 4.0 for r in ready), now
        assert sum(r.state == "loading" for r in reps.values()) <= 1
    assert refreshed >= 4
