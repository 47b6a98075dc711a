"""Every kind an action is sent with is one that prewarm.domain.action_kinds names: a kind spelled anew somewhere (a
step's new load kind, a baseline's) would be missing from the lists that read kinds (the loads ahead of demand that
the ROI counts as cold starts avoided; what operators filter events on)."""

from __future__ import annotations

import numpy as np

from prewarm.domain import action_kinds as ak
from prewarm.domain.policy import PolicyConfig
from prewarm.domain.policy.types import Evict, Preload, Stage, Unstage
from simulator.diagnose import DiagnosticSimulation
from simulator.policies import POLICIES, Prewarm
from simulator.trace import GIB

from .test_sim import trace


def _traffic(models: int = 14, minutes: int = 180, seed: int = 3) -> list[tuple[float, str]]:
    """Models that come back in bursts at their own periods (loads ahead, evictions to make room), a few never
    asked for until late (fills), and one asked once every 20 minutes (the hybrid histogram's pre-warm)."""
    rng = np.random.default_rng(seed)
    events = []
    for k in range(models):
        period = (9 + 4 * k) * 60
        first = 0 if k < models - 3 else minutes * 60 // 2
        for start in range(first + k * 11, minutes * 60, period):
            events += [(start + float(x), f"m{k}") for x in np.sort(rng.uniform(0, 40, 8))]
    events += [(float(t), "clock") for t in range(30, minutes * 60, 20 * 60)]
    return sorted(events)


class _Recording(Prewarm):
    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.kinds: dict[type, set[str]] = {}

    def _apply(self, actions, t):  # type: ignore[no-untyped-def]
        actions = list(actions)
        for a in actions:
            self.kinds.setdefault(type(a), set()).add(a.kind)
        super()._apply(actions, t)


def _sim(events: list[tuple[float, str]], host_bytes: int = 0, gpu_gib: int = 5) -> DiagnosticSimulation:
    """The engine as `simulator.diagnose` runs it: it counts the kind of every load it starts (`load_kinds`; a
    baseline's kinds reach it only there)."""
    tr = trace(events)
    sizes = np.array([int((1.0 + (i % 3) * 0.5) * GIB) for i in range(len(tr.models))], dtype=np.int64)
    loads = np.array([2.0 + (i % 4) for i in range(len(tr.models))])
    return DiagnosticSimulation(tr, sizes, loads, 2, gpu_gib * GIB, "shared", nodes=1 if host_bytes else None, host_bytes=host_bytes)


def test_every_kind_prewarm_sends_is_named() -> None:
    events = _traffic()
    pol = _Recording()
    _sim(events, host_bytes=6 * GIB).run(pol)
    got = pol.kinds
    assert got[Preload] <= set(ak.LOAD_KINDS), got[Preload] - set(ak.LOAD_KINDS)
    assert got[Evict] <= set(ak.EVICT_KINDS), got[Evict] - set(ak.EVICT_KINDS)
    assert got.get(Stage, set()) <= set(ak.STAGE_KINDS) and got.get(Unstage, set()) <= set(ak.EVICT_KINDS)
    # the run exercises the kinds it checks: demand, loads ahead and fills, evictions for room, stages
    assert {ak.DEMAND, ak.SPECULATIVE, ak.FILL} <= got[Preload], got[Preload]
    assert ak.MAKE_ROOM in got[Evict] and got.get(Stage), got


def test_every_kind_a_baseline_loads_with_is_named() -> None:
    events = _traffic()
    seen: dict[str, set[str]] = {}
    for name, cls in POLICIES.items():
        if name == "prewarm":
            continue
        sim = _sim(events, gpu_gib=8)  # room for the hybrid histogram's pre-warm beside what was used since
        sim.run(cls())
        seen[name] = set(sim.load_kinds)
    assert all(k <= set(ak.LOAD_KINDS) for k in seen.values()), seen
    # the run exercises them: the rules load on demand (the oracle only ahead), and the three that load ahead do here
    assert all(ak.DEMAND in k for name, k in seen.items() if name != "oracle"), seen
    assert ak.PREWARM in seen["hybrid-histogram"] and ak.FORECAST in seen["forecast"] and ak.PREFETCH in seen["oracle"]
