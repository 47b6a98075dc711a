"""prewarm's warming policy: a pure function from what the scheduler knows to what it should do.

    actions = plan(snapshot, now, state=None)

- `snapshot` (`Snapshot`, frozen): the catalog (`models`: id → `ModelSpec`), the fleet (`gpus`:
  `GpuState`), what is on it (`replicas`: `ReplicaState`, including pending/loading ones), actions
  dispatched but not yet confirmed (`intents`: `Intent`, ignored once `expires_at` passed), the
  time of each model's last eviction (`recent_evictions`: for the cooldown, and so that requests
  served before an eviction do not read as new demand), models whose requests wait for a replica
  (`waiting`: model → count, e.g. the route hook's "cold" answers not yet covered by a load), the traffic
  (`traffic`: a `TrafficHistory`) and the `PolicyConfig`.
- `now`: the caller's clock (Unix seconds live, virtual seconds in the simulator).
- `state` (optional `PolicyState`): a cache the caller may keep between calls, one per
  TrafficHistory. plan() updates it in place. It only memoises things derived from the traffic
  (arrival models, when each model turns hot or cold), so the decisions are the same with a
  fresh state; with a kept one a tick costs O(models whose traffic changed) instead of O(models).
  One part is a record, not a cache: the no-regret layer's duels and ghosts (experts.py, duels.py,
  PolicyConfig.no_regret, on by default), so with the layer on a kept state orders evictions by the leading expert where a
  fresh one (no record) uses prewarm's own order.
- returns a list of `Preload` / `Evict` actions, each with `reason` (words) and `numbers`. Evicts
  that make room come right before the Preload they make room for; dispatch them in order on the
  GPU's queue.

plan() never does I/O, never reads a clock, and is deterministic for (snapshot, now, state).

The live scheduler, every tick:

    history = TrafficHistory.for_config(cfg)     # once, at start
    state = PolicyState()                        # once, at start
    ...
    for model, second, count in new_buckets:     # per-second counts since the last tick
        history.add_bucket(model, second, count)
    snap = Snapshot(models=catalog, gpus=gpus, replicas=replicas, traffic=history,
                    intents=intents, recent_evictions=last_evicted_at, waiting=cold_waiting,
                    config=cfg)
    for action in plan(snap, time.time(), state):
        dispatch(action)   # Preload → preload task, Evict → evict task, on action.gpu's queue

What the policy does is described in `planner`'s docstring; the idle-time model in `arrivals`. A catalog with
LoRA adapters (ModelSpec.base) is planned by `plan_with_adapters` (adapters.py): plan() for the bases, then the
adapters in their base replicas' slots; the caller feeds each request under `traffic_keys(models, model)`.
"""

from . import native

# a native (mypyc) build of the hot modules, when one matches these sources; see native.py
native.activate(__path__)

from .adapters import plan_with_adapters, traffic_keys  # noqa: E402
from .history import TrafficHistory  # noqa: E402
from .planner import PolicyState, load_seconds, plan  # noqa: E402
from .types import (  # noqa: E402
    GIB,
    STALE_RATE_READINGS,
    Action,
    Evict,
    GpuState,
    Intent,
    Keep,
    ModelSpec,
    NodeState,
    PolicyConfig,
    Preload,
    ReplicaState,
    Snapshot,
    Stage,
    StagedState,
    TrafficView,
    Unstage,
)

__all__ = [
    "GIB",
    "Action",
    "Evict",
    "GpuState",
    "Intent",
    "Keep",
    "ModelSpec",
    "NodeState",
    "PolicyConfig",
    "PolicyState",
    "STALE_RATE_READINGS",
    "Preload",
    "ReplicaState",
    "Snapshot",
    "Stage",
    "StagedState",
    "TrafficHistory",
    "TrafficView",
    "Unstage",
    "load_seconds",
    "plan",
    "plan_with_adapters",
    "traffic_keys",
]
