"""The baselines' decision rules, pure (no Redis, Celery, torch or Flask; no simulator), run by both the
simulator (`simulator.policies`) and the live scheduler (`baselines.live`). Each implements `base.Rule`
against a `base.Fleet`; each is implemented as published (the sources are in the classes' docstrings)."""

from __future__ import annotations

from .base import Fleet, ReplicaLike, Rule, recency
from .faascache import FaasCache
from .forecast import Forecast, fit_ses_grid
from .histogram import HybridHistogram
from .lru import KeepAlive, OnDemandLRU, SeedPool

# name -> rule class: every baseline that runs both simulated and live
RULES: dict[str, type[Rule]] = {
    "on-demand-lru": OnDemandLRU,
    "keepalive-10m": KeepAlive,
    "hybrid-histogram": HybridHistogram,
    "faascache": FaasCache,
    "seed-pool": SeedPool,
    "forecast": Forecast,
}

__all__ = ["RULES", "FaasCache", "Fleet", "Forecast", "HybridHistogram", "KeepAlive", "OnDemandLRU",
           "ReplicaLike", "Rule", "SeedPool", "fit_ses_grid", "recency"]
