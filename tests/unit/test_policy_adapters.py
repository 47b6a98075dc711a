"""LoRA adapters in the pure policy (issue 29, item 4): plan_with_adapters on hand-built snapshots."""

from __future__ import annotations

import dataclasses

from prewarm.domain.action_kinds import ADAPTER, ADAPTER_SLOTS
from prewarm.domain.policy import (
    GIB,
    Evict,
    GpuState,
    ModelSpec,
    PolicyConfig,
    Preload,
    ReplicaState,
    Snapshot,
    TrafficHistory,
    plan,
    plan_with_adapters,
    traffic_keys,
)
from prewarm.domain.policy.adapters import split

CFG = PolicyConfig(fill_free_memory=False)  # the fill's loads are not what these tests look at
MB = 1 << 20


def base(m: str = "B", gib: float = 4.0, slots: int = 2) -> ModelSpec:
    return ModelSpec(m, int(gib * GIB), load_seconds=20.0, max_adapters=slots)


def adapter(m: str, of: str = "B") -> ModelSpec:
    return ModelSpec(m, 50 * MB, load_seconds=0.5, base=of)


def whole(m: str, gib: float = 4.0) -> ModelSpec:
    return ModelSpec(m, int(gib * GIB), load_seconds=10.0)


def ready(m: str, gpu: str = "n/g0", bytes_: int = 0, host: str | None = None, state: str = "ready") -> ReplicaState:
    return ReplicaState(m, gpu, state, bytes_, -1e6, ready_at=-1e6 if state == "ready" else None, host=host)


def snapshot(models: list[ModelSpec], replicas: list[ReplicaState], traffic: TrafficHistory,
             gpus: tuple[tuple[str, float], ...] = (("n/g0", 10.0),), waiting: dict[str, int] | None = None) -> Snapshot:
    specs = {s.id: s for s in models}
    reps = tuple(ReplicaState(r.model, r.gpu, r.state, r.bytes or specs[r.model].size_bytes, r.since,
                              ready_at=r.ready_at, host=r.host) for r in replicas)
    states = []
    for gid, gib in gpus:
        used = sum(r.bytes for r in reps if r.gpu == gid)
        states.append(GpuState(gid, gid.split("/")[0], int(gib * GIB), int(gib * GIB) - used, joined_at=-1e6))
    return Snapshot(specs, tuple(states), reps, traffic, waiting=waiting or {},
                    waiting_since={m: 999.0 for m in waiting or {}}, config=CFG)


def feed(tr: TrafficHistory, models: list[ModelSpec], model: str, times: range | list[float]) -> None:
    specs = {s.id: s for s in models}
    for t in times:
        for key in traffic_keys(model, specs[model].base):
            tr.add(key, float(t))


def test_an_adapters_request_counts_for_its_base_too() -> None:
    assert traffic_keys("a1", "B") == ("a1", "B")
    assert traffic_keys("X", None) == ("X",)


def test_a_base_whose_adapters_are_busy_keeps_its_memory_although_no_request_names_it() -> None:
    # One GPU holds two of B, X, Y. B's adapter a1 is asked every 5 s; X was asked once, 1,000 s ago; Y waits.
    # B's value is its adapters' traffic: the victim for Y is X, not B.
    models = [base(), adapter("a1"), whole("X"), whole("Y")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "X", [0.0])
    feed(tr, models, "a1", range(0, 1000, 5))
    feed(tr, models, "Y", [999.0])
    snap = snapshot(models, [ready("B"), ready("X"), ready("a1", host="B")], tr, gpus=(("n/g0", 9.0),),
                    waiting={"Y": 1})
    acts = plan_with_adapters(snap, 1000.0)
    evicts = [(a.model, a.gpu) for a in acts if isinstance(a, Evict)]
    assert ("X", "n/g0") in evicts and ("B", "n/g0") not in evicts
    assert any(isinstance(a, Preload) and a.model == "Y" for a in acts)


def test_an_adapter_whose_traffic_comes_is_preloaded_into_the_base_replica_with_a_free_slot() -> None:
    # B ready on g0 with 2 slots, a1 in one; a2 has been asked every 10 s for the last 100 s; a3 never.
    models = [base(), adapter("a1"), adapter("a2"), adapter("a3")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "a1", range(0, 1000, 5))
    feed(tr, models, "a2", range(900, 1000, 10))
    snap = snapshot(models, [ready("B"), ready("a1", host="B")], tr)
    acts = plan_with_adapters(snap, 1000.0)
    loads = [(a.model, a.gpu, a.kind) for a in acts if isinstance(a, Preload)]
    assert loads == [("a2", "n/g0", ADAPTER)]
    assert not any(isinstance(a, Evict) for a in acts)


def test_a_full_replica_evicts_its_least_valuable_adapter_for_a_busier_one() -> None:
    # 2 slots: a1 (asked every 5 s) and a2 (asked once, 900 s ago); a3 is asked every 2 s and held nowhere.
    models = [base(), adapter("a1"), adapter("a2"), adapter("a3")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "a1", range(0, 1000, 5))
    feed(tr, models, "a2", [100.0])
    feed(tr, models, "a3", range(900, 1000, 2))
    snap = snapshot(models, [ready("B"), ready("a1", host="B"), ready("a2", host="B")], tr)
    acts = [a for a in plan_with_adapters(snap, 1000.0) if a.model.startswith("a")]
    assert [(type(a).__name__, a.model, a.gpu) for a in acts] == [("Evict", "a2", "n/g0"), ("Preload", "a3", "n/g0")]


def test_a_full_replica_keeps_adapters_not_clearly_less_valuable() -> None:
    # a2 and a3 asked alike: swapping them would only churn the slot (prefetch_margin)
    models = [base(), adapter("a1"), adapter("a2"), adapter("a3")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "a1", range(0, 1000, 5))
    feed(tr, models, "a2", range(0, 1000, 20))
    feed(tr, models, "a3", range(1, 1000, 20))
    snap = snapshot(models, [ready("B"), ready("a1", host="B"), ready("a2", host="B")], tr)
    assert not [a for a in plan_with_adapters(snap, 1000.0) if a.model.startswith("a")]


def test_no_adapter_is_planned_without_a_ready_replica_of_its_base() -> None:
    models = [base(), adapter("a1")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "a1", range(900, 1000, 5))
    for reps in ([ready("B", state="loading")], []):  # its base still loading, or nowhere
        acts = plan_with_adapters(snapshot(models, reps, tr), 1000.0)
        assert not [a for a in acts if a.model == "a1"]


def test_a_request_waiting_on_an_adapter_whose_base_is_not_ready_is_demand_for_the_base() -> None:
    models = [base(), adapter("a1")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "a1", [500.0])  # long before the demand window: only `waiting` says it waits
    acts = plan_with_adapters(snapshot(models, [], tr, waiting={"a1": 1}), 1000.0)
    assert [(a.model, a.kind) for a in acts if isinstance(a, Preload)] == [("B", "demand")]


def test_a_waiting_adapter_on_a_ready_base_takes_a_slot_from_any_ready_adapter() -> None:
    # 1 slot, held by a busy a1; a router waits on a2 (the route hook found every slot taken)
    models = [base(slots=1), adapter("a1"), adapter("a2")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "a1", range(0, 1000, 2))
    snap = snapshot(models, [ready("B"), ready("a1", host="B")], tr, waiting={"a2": 1})
    acts = [a for a in plan_with_adapters(snap, 1000.0) if a.model.startswith("a")]
    assert [(type(a).__name__, a.model, a.kind) for a in acts] == [("Evict", "a1", "make_room"),
                                                                    ("Preload", "a2", "demand")]


def test_a_working_set_larger_than_the_slots_starts_one_more_base_replica_in_free_memory() -> None:
    # 1 slot per replica, 2 busy adapters: one more replica of B, on g1 (free); none where B does not fit
    models = [base(slots=1), adapter("a1"), adapter("a2")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "a1", range(0, 1000, 3))
    feed(tr, models, "a2", range(1, 1000, 3))
    reps = [ready("B"), ready("a1", host="B")]
    acts = plan_with_adapters(snapshot(models, reps, tr, gpus=(("n/g0", 10.0), ("n/g1", 10.0))), 1000.0)
    assert [(a.model, a.gpu, a.kind) for a in acts if isinstance(a, Preload) and a.model == "B"] == \
        [("B", "n/g1", ADAPTER_SLOTS)]
    acts = plan_with_adapters(snapshot(models, reps, tr, gpus=(("n/g0", 10.0), ("n/g1", 3.0))), 1000.0)
    assert not [a for a in acts if a.model == "B"]
    # off (PolicyConfig.adapter_slot_replicas): the adapters share the replica the bases' plan keeps
    off = dataclasses.replace(snapshot(models, reps, tr, gpus=(("n/g0", 10.0), ("n/g1", 10.0))),
                              config=dataclasses.replace(CFG, adapter_slot_replicas=False))
    assert not [a for a in plan_with_adapters(off, 1000.0) if a.model == "B"]


def test_without_adapters_it_is_plan() -> None:
    models = [whole("X"), whole("Y")]
    tr = TrafficHistory.for_config(CFG)
    feed(tr, models, "X", range(900, 1000, 5))
    snap = snapshot(models, [ready("Y")], tr)
    assert plan_with_adapters(snap, 1000.0) == plan(snap, 1000.0)


def test_a_catalog_without_adapters_splits_to_none_every_time() -> None:
    """split() memoises the last catalog: its second answer for one without adapters is None as its first (it
    was the pair (catalog, {}), so plan_with_adapters took the adapters' path, bases_view and plan_adapters
    included, on every call after the first)."""
    whole = {"a": ModelSpec("a", GIB), "b": ModelSpec("b", 2 * GIB)}
    assert split(whole) is None and split(whole) is None
    mixed = {**whole, "a-ft": ModelSpec("a-ft", GIB // 100, base="a")}
    assert split(mixed) == split(mixed) == (whole, {"a-ft": mixed["a-ft"]})
