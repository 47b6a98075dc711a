"""A model whose spec makes the policy raise does not stop the live tick (issue 24, finding 2.5): the tick
plans the other models and says which failed and why (its result, the status hash, a `plan_failed` event,
prewarm_scheduler_plan_failures{model}); the model is planned again once its spec changes.

The catalog refuses a non-finite max_rate_per_replica now, so the fault is a catalog entry built directly
(dataclasses.replace skips parse_catalog), as a programming error would build it, swapped into the
scheduler's loaded catalog."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest

from gpu_worker.sized_catalog import write_sized_catalog
from prewarm import events, keys, metrics_defs
from prewarm.catalog_entries import Catalog
from prewarm.config import Settings
from prewarm.context import Context
from scheduler.live import Scheduler
from tests.system.test_scheduler_live import announce, queued_tasks, ramp

MIB = 1024**2
NAN_ERROR = "ValueError: cannot convert float NaN to integer"


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    catalog = write_sized_catalog(tmp_path / "models", {"hot": 64 * MIB, "bad": 32 * MIB, "floor": 16 * MIB},
                                  min_replicas={"bad": 1, "floor": 1})
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_LEADER_TTL": "5",
           "PREWARM_DATA_DIR": str(tmp_path / "var")}
    return Context(Settings.from_env(env))


def swap_entry(ctx: Context, model: str, **fields: object) -> None:
    """The context's loaded catalog with `model`'s entry changed, bypassing validation (the file is not
    touched, so the context keeps this catalog)."""
    cat = ctx.catalog
    models = [dataclasses.replace(m, **fields) if m.id == model else m for m in cat.models]
    ctx._catalog = Catalog(cat.path, models, dict(cat.problems))


def failures(model: str) -> float:
    counter = metrics_defs.in_process_counter(metrics_defs.SCHEDULER_PLAN_FAILURES)
    return next((s.value for m in counter.collect() for s in m.samples
                 if s.name.endswith("_total") and s.labels == {"model": model}), 0.0)


def preloaded(ctx: Context, queue: str) -> list[str]:
    return sorted(json.loads(t["argsrepr"].replace("'", '"'))[0] for t in queued_tasks(ctx.r, queue)
                  if t["task"] == "prewarm.preload")


def test_a_spec_that_makes_the_plan_raise_leaves_only_that_model_out(ctx: Context) -> None:
    g = announce(ctx.r, "node-a", "cpu:0")
    announce(ctx.r, "node-b", "cpu:0")
    now = time.time()
    ramp(ctx.r, "hot", now)
    swap_entry(ctx, "bad", max_rate_per_replica=math.nan)
    before = failures("bad")
    sched = Scheduler(ctx, ident="s1")
    res = sched.tick(now)
    # planned: the ramp's demand load and the other floor; "bad" named with why
    assert res.leader and res.left_out == {"bad": NAN_ERROR}
    queues = (g.queue, "gpu.node-b.cpu:0")
    assert sorted(m for q in queues for m in preloaded(ctx, q)) == ["floor", "hot"]
    assert res.dispatched == 2
    assert ctx.r.hget(keys.SCHEDULER_STATUS, "left_out") == b"bad"
    # the no-regret layer (on by default) and the loads-ahead record say where they stand, for the console
    assert ctx.r.hget(keys.SCHEDULER_STATUS, "expert").startswith(b"expert prewarm leads")
    assert ctx.r.hget(keys.SCHEDULER_STATUS, "loads_ahead").startswith(b"loads ahead on")
    [ev] = events.read(ctx.r, kind="plan_failed")
    assert ev.model == "bad" and NAN_ERROR in ev.reason and ev.numbers["error"] == NAN_ERROR
    assert failures("bad") == before + 1
    # The next tick plans without it at once: no second search, event or count.
    res = sched.tick(now + 2)
    assert res.left_out == {"bad": NAN_ERROR} and len(events.read(ctx.r, kind="plan_failed")) == 1
    assert failures("bad") == before + 1
    # Its entry fixed: planned again (its floor of one replica).
    swap_entry(ctx, "bad", max_rate_per_replica=2.0)
    res = sched.tick(now + 4)
    assert res.left_out == {} and ctx.r.hget(keys.SCHEDULER_STATUS, "left_out") == b""
    assert "bad" in [m for q in queues for m in preloaded(ctx, q)]
