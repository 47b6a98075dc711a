"""The kinds of the fleet's actions (a Preload's, an Evict's or a Stage's `kind`): the one place each is spelled, and
the one list of the loads made ahead of demand (the ROI's cold starts avoided: a warm hit on such a replica, live in
prewarm.store.load_kinds, in the simulator's engine; simulator.diagnose's account of loads ahead).

Dependency-free on purpose, as prewarm.domain.states: the pure policy imports it, and its native build compiles
against it. A kind is also what operators filter on (`prewarm events`, the `reason` label of
`prewarm_evictions_total`): its spelling is an interface."""

from __future__ import annotations

from typing import Literal, get_args

# Loads. prewarm's plan: a request waiting (demand), a predicted request (speculative; its partners' loads too), a
# floor (pinned / min_replicas), an extra replica for a rising rate (scale), a new GPU's hottest models (new_gpu),
# a replica replaced by age (refresh), a never-requested model in free memory (fill: its first request need not be
# cold), a LoRA adapter warmed in its base's slot (adapter) or a base replica for its adapters (adapter_slots).
# The baselines' rules (live too, as PREWARM_POLICY): the hybrid histogram's pre-warm (prewarm), the forecast
# autoscaler's loads for a forecast rate (forecast), the oracle's prefetch. And the operator's and a drain's loads.
LoadKind = Literal["demand", "speculative", "min_replicas", "scale", "new_gpu", "refresh", "fill", "adapter",
                   "adapter_slots", "prewarm", "forecast", "prefetch", "operator", "drain"]
LOAD_KINDS: tuple[str, ...] = get_args(LoadKind)
(DEMAND, SPECULATIVE, MIN_REPLICAS, SCALE, NEW_GPU, REFRESH, FILL, ADAPTER, ADAPTER_SLOTS, PREWARM, FORECAST, PREFETCH,
 OPERATOR, DRAIN) = LOAD_KINDS

# Loads made ahead of demand, on a prediction. Demand, floors, refresh, drain, operator and router loads answer a
# request or a rule, not a prediction; so does a base replica for adapters already asked for.
AHEAD_OF_DEMAND: frozenset[str] = frozenset((SPECULATIVE, NEW_GPU, SCALE, FILL, ADAPTER, PREWARM, FORECAST, PREFETCH))

# Evictions: room for a load (make_room; an unstage for a stage too), over the idle-memory budget (idle_budget), a fill
# still loading that gives way to a demand load (yield), a baseline's rule unloading a model (quiet: its keep-alive
# is over), and the refresh, operator and drain kinds above.
EvictKind = Literal["make_room", "idle_budget", "yield", "quiet", "refresh", "operator", "drain"]
EVICT_KINDS: tuple[str, ...] = get_args(EvictKind)
MAKE_ROOM, IDLE_BUDGET, YIELD, QUIET = EVICT_KINDS[:4]

# Stages into a node's host cache: a model evicted from its GPUs and still valued (demote), or one likely soon with
# no GPU free (likely); and the operator's.
StageKind = Literal["demote", "likely", "operator"]
STAGE_KINDS: tuple[str, ...] = get_args(StageKind)
DEMOTE, LIKELY = STAGE_KINDS[:2]
