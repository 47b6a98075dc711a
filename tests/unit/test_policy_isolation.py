"""One bad model never stops the live plan for the others (issue 24, finding 2.5): scheduler.isolation finds
the model whose spec makes plan() raise, leaves it out, and plans the rest as if it were not in the catalog.

The catalog now refuses a non-finite max_rate_per_replica, so the fault is injected at the planner boundary:
a ModelSpec built directly, as a programming error would build it. plan() itself is unchanged (it still
raises on such a spec, and the simulator runs it as it is)."""

from __future__ import annotations

import math

import pytest

from prewarm.domain.choice import Policy, make_policy
from prewarm.domain.policy import GIB, GpuState, ModelSpec, PolicyConfig, Snapshot, TrafficHistory, plan
from scheduler.isolation import Isolation, culprit, without

NOW = 10_000.0
NAN_ERROR = "ValueError: cannot convert float NaN to integer"


def snapshot(models: list[ModelSpec], cfg: PolicyConfig | None = None, busy: tuple[str, ...] = ("a",),
             gpus: int = 1) -> Snapshot:
    """`gpus` GPUs of 8 GiB (two load slots each); `busy` models had 3 requests/s for the last minute and
    wait for a replica."""
    cfg = cfg or PolicyConfig()
    tr = TrafficHistory.for_config(PolicyConfig())
    for t in range(int(NOW) - 60, int(NOW)):
        for m in busy:
            tr.add_bucket(m, t, 3)
    fleet = tuple(GpuState(f"n/g{i}", "n", 8 * GIB, 8 * GIB) for i in range(gpus))
    return Snapshot({m.id: m for m in models}, fleet, (), tr,
                    waiting=dict.fromkeys(busy, 1), config=cfg)


def fresh() -> Policy:
    return make_policy("prewarm", PolicyConfig())


def bad(model: str, rate: float = math.nan) -> ModelSpec:
    """min_replicas 1 gives it a replica in the plan; step_scale then divides by its rate cap."""
    return ModelSpec(model, GIB, min_replicas=1, max_rate_per_replica=rate)


def shown(actions: list) -> list[tuple[str, str, str, str]]:
    return [(type(a).__name__, a.model, a.gpu, a.kind) for a in actions]


def first_error(snap: Snapshot) -> Exception:
    with pytest.raises(Exception) as info:
        fresh().decide(snap, NOW)
    return info.value


def test_plan_raises_on_the_bad_spec_and_the_rest_is_planned_as_without_it() -> None:
    snap = snapshot([ModelSpec("a", GIB), bad("bad"), ModelSpec("c", GIB, min_replicas=1)])
    with pytest.raises(ValueError, match="cannot convert float NaN to integer"):
        plan(snap, NOW)  # the fault: every tick's plan raised, nothing was planned for any model
    iso = Isolation()
    policy, actions, found = iso.isolate(fresh, snap, NOW, (), first_error(snap))
    assert found == {"bad": NAN_ERROR}
    assert shown(actions) == shown(plan(without(snap, {"bad"}), NOW))  # as if "bad" were not in the catalog
    assert shown(actions) == [("Preload", "a", "n/g0", "demand"), ("Preload", "c", "n/g0", "min_replicas")]
    # The next ticks plan the same view (the same models mapping, so the policy's cache carries on).
    view, back = iso.view(snap)
    assert back == [] and view.models is iso.view(snap)[0].models and set(view.models) == {"a", "c"}
    assert shown(policy.decide(view, NOW + 2)) == shown(plan(view, NOW + 2))
    assert {m: x.reason for m, x in iso.left_out.items()} == {"bad": NAN_ERROR}


def test_two_bad_models_are_both_left_out() -> None:
    # a rate over 5e-324 is inf: math.ceil overflows (the catalog's old check let 5e-324 through); it needs
    # traffic of its own, where nan fails with none
    models = [ModelSpec("a", GIB), bad("bad-nan"), ModelSpec("b", GIB), bad("bad-tiny", 5e-324)]
    snap = snapshot(models, busy=("a", "b", "bad-tiny"), gpus=2)  # a slot for each of the four loads
    _policy, actions, found = Isolation().isolate(fresh, snap, NOW, (), first_error(snap))
    assert found == {"bad-nan": NAN_ERROR, "bad-tiny": "OverflowError: cannot convert float infinity to integer"}
    assert {a.model for a in actions} == {"a", "b"}


def test_a_model_is_planned_again_once_its_spec_changes() -> None:
    snap = snapshot([ModelSpec("a", GIB), bad("bad")])
    iso = Isolation()
    iso.isolate(fresh, snap, NOW, (), first_error(snap))
    fixed = snapshot([ModelSpec("a", GIB), bad("bad", 2.0)])
    view, back = iso.view(fixed)
    assert back == ["bad"] and view is fixed and iso.left_out == {}
    assert "bad" in {a.model for a in fresh().decide(view, NOW)}


def test_a_fault_no_one_model_explains_leaves_nothing_out() -> None:
    """A config every model's plan divides by (grid_s = 0): each model with traffic fails alone, and leaving
    out MAX_FAULTS of them cures nothing. The tick fails as before; the search is not run again on the same
    models mapping."""
    snap = snapshot([ModelSpec(f"m{i}", GIB) for i in range(8)], PolicyConfig(grid_s=0.0),
                    busy=tuple(f"m{i}" for i in range(8)))
    error = first_error(snap)
    iso = Isolation()
    calls = 0

    def counted() -> Policy:
        nonlocal calls
        calls += 1
        return fresh()

    with pytest.raises(ZeroDivisionError) as info:
        iso.isolate(counted, snap, NOW, (), error)
    assert info.value is error and iso.left_out == {} and calls > 0
    assert iso.view(snap) == (snap, [])
    calls = 0
    with pytest.raises(ZeroDivisionError):
        iso.isolate(counted, snap, NOW, (), error)
    assert calls == 0


def test_culprit_halves_to_the_one_model() -> None:
    names = [f"m{i:02d}" for i in range(37)]
    asked: list[int] = []

    def fails(group: list[str]) -> Exception | None:
        asked.append(len(group))
        return ValueError("m23") if "m23" in group else None

    hit = culprit(fails, names)
    assert hit is not None and hit[0] == "m23" and str(hit[1]) == "m23"
    assert sum(asked) <= 2 * len(names)  # about one plan of the whole set in all
    assert culprit(lambda g: ValueError() if {"m01", "m30"} <= set(g) else None, names) is None
