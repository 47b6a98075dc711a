"""Which loads are made ahead of demand: the one list of their kinds (a Preload's `kind`), for the ROI's cold starts
avoided (a warm hit on such a replica: live in prewarm.store.load_kinds, in the simulator's engine) and for
simulator.diagnose's account of loads ahead. Dependency-free."""

from __future__ import annotations

# prewarm's plan: a predicted request (speculative, its partners' loads too), a new GPU's hottest models, an extra
# replica for a rising rate, a never-requested model in free memory (fill: its first request need not be cold), a
# LoRA adapter warmed in its base's slot. The baselines' rules (live too, as PREWARM_POLICY): the hybrid histogram's
# pre-warm, the forecast autoscaler's loads for a forecast rate, the oracle's prefetch. Demand, min_replicas,
# refresh, drain, operator and router loads answer a request or a rule, not a prediction.
AHEAD_OF_DEMAND: frozenset[str] = frozenset(
    ("speculative", "new_gpu", "scale", "fill", "adapter", "prewarm", "forecast", "prefetch"))
