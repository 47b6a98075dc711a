"""Whole experts live (prewarm.domain.whole; PREWARM_WHOLE_EXPERTS, on by default): the live scheduler runs the code the simulator runs.
When a whole baseline's shadow leads (forced here: a real lead takes an hour of record), the expert plans the real
fleet through the same dispatch path, every action's reason and the status say so, and a replica turning ready
while a router waits wakes the leader for the expert's rule. Real Redis, a real Scheduler, Celery's queues in Redis."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpu_worker.sized_catalog import write_sized_catalog
from prewarm import events, keys
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.domain.whole import WholeExperts
from prewarm.store import cold_starts
from scheduler.live import Scheduler
from tests.system.test_scheduler_live import announce, queued_tasks

MIB = 1024**2


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    catalog = write_sized_catalog(tmp_path / "models", {"hot": 64 * MIB, "other": 32 * MIB})
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_LEADER_TTL": "30",
           "PREWARM_DATA_DIR": str(tmp_path / "var"), "PREWARM_WHOLE_EXPERTS": "1"}
    return Context(Settings.from_env(env))


def test_a_whole_expert_plans_the_live_fleet_says_so_and_is_woken_by_a_finished_load(
        ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ctx.settings.whole_experts
    g = announce(ctx.r, "node-a", "cpu:0")
    monkeypatch.setattr(WholeExperts, "best", lambda self, now, halflife_s: "on-demand-lru")
    sched = Scheduler(ctx, ident="s1")
    now = time.time()
    assert sched.tick(now).leader
    status = ctx.r.hget(keys.SCHEDULER_STATUS, "expert") or b""
    assert status.startswith(b"whole expert on-demand-lru plans"), status
    assert sched.policy is not None and sched.policy.wakes_on_ready()
    # a router waits for "hot" (the route hook opened its cold episode): LRU's rule loads it on the miss
    cold_starts.open_episode(ctx.r, "hot", "v1", now + 1)
    res = sched.tick(now + 2)
    assert res.dispatched == 1
    [task] = [t for t in queued_tasks(ctx.r, g.queue) if t["task"] == "prewarm.preload"]
    assert json.loads(task["argsrepr"].replace("'", '"'))[0] == "hot"
    [ev] = [e for e in events.read(ctx.r, kind="preload") if e.model == "hot"]
    assert "whole expert on-demand-lru plans" in ev.reason, ev.reason
    # a replica turning ready while the router still waits wakes the leader: the expert's rule acts on that event
    woken = sched.wake(["ready:other@v1"])
    assert woken is not None and woken.leader
    [wake] = events.read(ctx.r, kind="wake")
    assert wake.numbers["trigger"] == "ready"
    sched.leadership.release()
