"""The replica and staged-copy state names: the one place they are spelled.

Dependency-free on purpose: the pure policy (prewarm/domain/policy/types.py) imports it as well as the fleet
records (prewarm/state.py), the web and the worker, and the policy's native build compiles against it.
"""

from __future__ import annotations

from typing import Literal, get_args

# A replica's lifecycle: pending -> loading -> warming -> ready -> evicting -> gone; or failed (with a reason).
ReplicaStateName = Literal["pending", "loading", "warming", "ready", "evicting", "failed"]
REPLICA_STATES: tuple[str, ...] = get_args(ReplicaStateName)
PENDING, LOADING, WARMING, READY, EVICTING, FAILED = REPLICA_STATES

# A load holding one of its GPU's load slots, or queued (`pending`) for one.
IN_FLIGHT: tuple[str, ...] = (PENDING, LOADING, WARMING)
# States that hold (or are about to hold) device memory: everything but failed.
HOLDING: tuple[str, ...] = (*IN_FLIGHT, READY, EVICTING)
# What a router may be told about, best first: `ready` serves now, the others say when it will.
ROUTABLE: tuple[str, ...] = (READY, WARMING, LOADING, PENDING)

# A model's copy in a node's host cache (the staging tier): "staging" while being read, then "staged".
StagedStateName = Literal["staging", "staged"]
STAGED_STATES: tuple[str, ...] = get_args(StagedStateName)
STAGING, STAGED = STAGED_STATES

# A route answer's state (GET /hooks/route): `ready` serves now, `loading` will (with an ETA), `cold`
# has no replica on the way. Not a replica state: a `loading` answer may stand for a pending replica.
RouteStateName = Literal["ready", "loading", "cold"]
ROUTE_STATES: tuple[str, ...] = get_args(RouteStateName)
ROUTE_READY, ROUTE_LOADING, ROUTE_COLD = ROUTE_STATES
