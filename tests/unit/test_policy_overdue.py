"""A request that has waited overdue_wait_s is served next: hand-built snapshots, one plan() call each."""

from __future__ import annotations

import pytest

from prewarm.config import Settings, parse_max_demand_wait
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
)

NOW = 1000.0
OFF = None  # the rule off (the default): the order before it


def _snap(cfg: PolicyConfig, gpus: list[tuple[str, float]], replicas: list[tuple[str, str, float, str, float]],
          models: dict[str, tuple[float, float]], waiting_since: dict[str, float],
          traffic: dict[str, int] | None = None) -> Snapshot:
    """gpus: (id, GiB); replicas: (model, gpu, GiB, state, since); models: id -> (GiB, load s)."""
    specs = {m: ModelSpec(m, int(g * GIB), load_seconds=ld) for m, (g, ld) in models.items()}
    hist = TrafficHistory.for_config(cfg)
    for m, n in (traffic or {}).items():
        for s in range(20):
            hist.add(m, NOW - 20 + s, n)
    reps = tuple(ReplicaState(m, g, st, int(gib * GIB), since) for m, g, gib, st, since in replicas)
    gs = []
    for gid, gib in gpus:
        used = sum(r.bytes for r in reps if r.gpu == gid)
        gs.append(GpuState(gid, gid.split("/")[0], int(gib * GIB), int(gib * GIB) - used, joined_at=-1e9))
    return Snapshot(specs, tuple(gs), reps, hist, waiting=dict.fromkeys(waiting_since, 1),
                    waiting_since=waiting_since, config=cfg)


def _acts(snap: Snapshot) -> list[tuple[str, str, str]]:
    return [(type(a).__name__, a.model, a.gpu) for a in plan(snap, NOW) if isinstance(a, (Evict, Preload))]


def test_an_overdue_model_evicts_replicas_younger_than_the_minimum_residency() -> None:
    """big (4 GiB) has waited 40 s; the GPU's only resident a (3 GiB) became ready 5 s ago (min
    residency 10 s). Without the rule nothing may be evicted; with it a goes and big loads."""
    def snap(overdue: float | None) -> Snapshot:
        return _snap(PolicyConfig(overdue_wait_s=overdue), [("n1/cuda:0", 4)],
                     [("a", "n1/cuda:0", 3, "ready", NOW - 5)], {"a": (3, 2.0), "big": (4, 4.0)},
                     {"big": NOW - 40})
    assert _acts(snap(OFF)) == []
    assert _acts(snap(30.0)) == [("Evict", "a", "n1/cuda:0"), ("Preload", "big", "n1/cuda:0")]
    assert "overdue" in next(a for a in plan(snap(30.0), NOW) if isinstance(a, Preload)).reason


def test_the_gpu_an_overdue_model_will_take_is_held_from_other_loads() -> None:
    """a (3 GiB) is loading on the only GPU (4 GiB, two load slots), so big (4 GiB, waited 40 s)
    cannot go there yet; small (1 GiB, waited 1 s) would take the last free GiB and, young, keep big
    out for another min residency. With the rule the GPU is held for big: small is not loaded."""
    def snap(overdue: float | None) -> Snapshot:
        return _snap(PolicyConfig(overdue_wait_s=overdue), [("n1/cuda:0", 4)],
                     [("a", "n1/cuda:0", 3, "loading", NOW - 1)],
                     {"a": (3, 2.0), "big": (4, 4.0), "small": (1, 1.0)},
                     {"big": NOW - 40, "small": NOW - 1}, traffic={"small": 5, "a": 1})
    assert _acts(snap(OFF)) == [("Preload", "small", "n1/cuda:0")]
    assert _acts(snap(30.0)) == []


def test_overdue_models_go_before_the_most_requests_per_load_second() -> None:
    """One load slot free. hot (1 GiB, 1 s load, 5 req/s) beats big (4 GiB, 8 s load, no recent
    rate) by Smith's rule; once big's oldest request has waited 40 s it goes first."""
    def snap(overdue: float | None) -> Snapshot:
        return _snap(PolicyConfig(overdue_wait_s=overdue, max_loads_per_gpu=1), [("n1/cuda:0", 8)], [],
                     {"hot": (1, 1.0), "big": (4, 8.0)}, {"hot": NOW - 1, "big": NOW - 40},
                     traffic={"hot": 5})
    assert _acts(snap(OFF)) == [("Preload", "hot", "n1/cuda:0")]
    assert _acts(snap(30.0)) == [("Preload", "big", "n1/cuda:0")]
    # not yet overdue at 20 s: the order is Smith's again
    s = snap(30.0)
    young = Snapshot(s.models, s.gpus, s.replicas, s.traffic, waiting=s.waiting,
                     waiting_since={"hot": NOW - 1, "big": NOW - 20}, config=s.config)
    assert _acts(young) == [("Preload", "hot", "n1/cuda:0")]


def test_the_rule_is_off_unless_set_and_the_setting_is_read_with_a_clear_error() -> None:
    assert PolicyConfig().overdue_wait_s is None
    assert Settings.from_env({}).max_demand_wait is None
    assert Settings.from_env({"PREWARM_MAX_DEMAND_WAIT": "2m"}).max_demand_wait == 120.0
    assert parse_max_demand_wait("off") is None and parse_max_demand_wait("45") == 45.0
    for bad in ("soon", "0s", "-5"):
        with pytest.raises(ValueError, match="PREWARM_MAX_DEMAND_WAIT=.*positive duration"):
            parse_max_demand_wait(bad)


def test_plan_refuses_traffic_that_is_not_a_traffic_history() -> None:
    """plan() reads the traffic through TrafficHistory's own methods (compiled, called directly): anything
    else is refused with a message naming what it needs, not misread."""
    s = _snap(PolicyConfig(), [("n/cuda:0", 80)], [], {"a": (10, 5)}, {"a": NOW - 5})
    with pytest.raises(TypeError, match="TrafficHistory, got dict"):
        plan(Snapshot(s.models, s.gpus, s.replicas, {"a": 1}, config=s.config), NOW)  # type: ignore[arg-type]
