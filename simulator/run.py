"""One simulation of each named policy on one trace and fleet: the figures `prewarm simulate` and the
sweep report."""

from __future__ import annotations

import sys
import time
from typing import Any

from prewarm.domain.policy import PolicyConfig, native
from prewarm.domain.slo import ColdStartSlo
from prewarm.heap import replay_gc

from .adapters import adapter_view
from .engine import Simulation
from .policies import POLICIES, Prewarm
from .slo_policy import SloPrewarm
from .trace import GIB, GPU_BYTES, Trace, load_profile, load_profile_fields, read_profile


def simulate(
    trace: Trace,
    profile: str | None,
    policies: list[str],
    gpus: int = 8,
    gpu_bytes: int = GPU_BYTES,
    contention: str = "shared",
    progress: bool = False,
    host_bytes: int = 0,
    stage_bandwidth: float = 2.0 * GIB,
    promote_bandwidth: float | None = None,
    load_slots: int = 2,
    slo: ColdStartSlo | None = None,
    idle_memory_budget: float | None = None,
    max_demand_wait: float | None = None,
    no_regret: bool = True,
    adapter_slot_replicas: bool = True,
    link_wait: bool = True,
    refute_stale_rate: str = "auto",
) -> dict:
    """`idle_memory_budget`: prewarm's PolicyConfig.idle_memory_budget (None: unlimited);
    `max_demand_wait`: its overdue_wait_s (None: off); `no_regret`: its no-regret layer (experts.py);
    `adapter_slot_replicas`: its base replicas for adapters' slots (adapters.py; an adapter trace only);
    `link_wait`: its demand loads wait for a busy link where that costs less (PolicyConfig.link_wait);
    `refute_stale_rate`: when a stopped stream is valued by its idle-time model (PolicyConfig.refute_stale_rate:
    auto, on, off)."""
    read = read_profile(profile) if profile is not None else None  # once, for the three readers below
    sizes, loads = load_profile(read, trace.models)
    priority, max_age = load_profile_fields(read, trace.models)
    adapters = None
    view = adapter_view(trace, read, sizes, loads, priority, max_age)  # issue 29: None for whole models
    if view is not None:
        trace, sizes, loads, priority, max_age, adapters = view
    out: dict[str, Any] = {
        "trace": {
            "source": trace.source, "format": trace.fmt, "models": len(trace.models),
            "requests": trace.requests, "span_s": trace.span_s,
            "model_bytes": int(sizes.sum()), "profile": profile,
        },
        "fleet": {"gpus": gpus, "gpu_bytes": gpu_bytes, "contention": contention,
                  "fleet_bytes": gpus * gpu_bytes, "host_bytes": host_bytes,
                  "stage_bandwidth": stage_bandwidth, "promote_bandwidth": promote_bandwidth,
                  "load_slots": load_slots},
        "idle_memory_budget": idle_memory_budget,  # prewarm's; None: unlimited
        "max_demand_wait": max_demand_wait,  # prewarm's; None: off
        "no_regret": no_regret,  # prewarm's no-regret layer
        "link_wait": link_wait,  # prewarm's demand loads wait for a busy link (PolicyConfig.link_wait)
        "refute_stale_rate": refute_stale_rate,  # prewarm's (PolicyConfig.refute_stale_rate)
        **({"adapter_slot_replicas": adapter_slot_replicas} if adapters is not None else {}),
        "policies": {},
        # prewarm's runtime depends on it; its decisions do not (the same source, compiled)
        "policy_build": "native" if native.active() else "python",
        "slo": slo.describe() if slo is not None else None,
    }
    for name in policies:
        sim = Simulation(trace, sizes, loads, gpus, gpu_bytes, contention, host_bytes=host_bytes,
                         stage_bandwidth=stage_bandwidth, promote_bandwidth=promote_bandwidth,
                         load_slots=load_slots, priority=priority, max_replica_age=max_age, adapters=adapters)
        if name == "prewarm":
            pol = (SloPrewarm(slo) if slo is not None
                   else Prewarm(PolicyConfig(idle_memory_budget=idle_memory_budget,
                                             overdue_wait_s=max_demand_wait, no_regret=no_regret,
                                             adapter_slot_replicas=adapter_slot_replicas, link_wait=link_wait,
                                             refute_stale_rate=refute_stale_rate)))
        else:
            pol = POLICIES[name]()
        t0 = time.perf_counter()
        with replay_gc():
            sim.run(pol)
        res = sim.results()
        if isinstance(pol, SloPrewarm):
            res["slo"] = pol.report(sim.now)
        res["runtime_s"] = round(time.perf_counter() - t0, 2)
        if isinstance(pol, Prewarm) and pol.cfg.no_regret:
            res["experts"] = pol.state.experts.describe()  # who led at the end, how often the lead moved
        if isinstance(pol, Prewarm) and pol.cfg.no_regret and pol.cfg.whole_experts:
            res["whole"] = pol.policy.whole.describe()  # which whole policy planned at the end, how often it moved
        if isinstance(pol, Prewarm) and pol.cfg.ahead_gate:
            res["ahead"] = pol.state.ahead.describe()  # what loads ahead won and lost, decayed, at the end
        if isinstance(pol, Prewarm) and pol.cfg.refute_stale_rate == "auto":
            res["stale_rates"] = pol.history.silences.describe()  # how often a stopped stream's rate was refuted
        out["policies"][name] = res
        if progress:
            build = f" ({out['policy_build']} policy build)" if name == "prewarm" else ""
            if "experts" in res:
                build += f"; expert {res['experts']['leader']} leads, {res['experts']['switches']} switch(es)"
            if "whole" in res:
                build += f"; whole: {res['whole']['leader']} plans, {res['whole']['switches']} switch(es)"
            if "ahead" in res:
                a = res["ahead"]
                build += f"; loads ahead {'on' if a['open'] else 'held back'} (won {a['won']}, lost {a['lost']})"
            if "stale_rates" in res:
                sr = res["stale_rates"]
                build += (f"; stale rates refuted at {sr['refuting_share']:.0%} of plans (stops {sr['stops']}, "
                          f"pauses {sr['pauses']} at the end)")
            print(f"  {name}: {res['cold_starts']} cold starts in {res['runtime_s']} s{build}", file=sys.stderr)
    oracle = out["policies"].get("oracle")
    for res in out["policies"].values():
        res["oracle_ratio"] = (
            res["cold_starts"] / oracle["cold_starts"] if oracle and oracle["cold_starts"] else None
        )
    return out
