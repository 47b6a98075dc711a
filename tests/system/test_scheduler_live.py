"""The live scheduler against a real Redis: snapshot from real traffic and heartbeats, plan, dispatch.

GPUs are announced with real heartbeat records (as a worker writes them); the tasks land in the GPUs'
Celery queues in Redis, where the test reads them. Worker-backed end-to-end runs are in
test_system_integration.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from gpu_worker.sized_catalog import write_sized_catalog
from prewarm import events, keys, state, traffic
from prewarm.config import Settings
from prewarm.context import Context
from scheduler.live import Scheduler

MIB = 1024**2
GIB = 1024**3


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    catalog = write_sized_catalog(tmp_path / "models", {"hot": 64 * MIB, "quiet": 32 * MIB, "other": 16 * MIB})
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_LEADER_TTL": "1",
           "PREWARM_DATA_DIR": str(tmp_path / "var")}
    return Context(Settings.from_env(env))


def announce(r: redis.Redis, node: str, device: str, total: int = 1 * GIB, started_at: float = 0.0) -> state.Gpu:
    g = state.Gpu(id=state.gpu_id(node, device), node=node, device=device, queue=state.queue_name(node, device),
                  total_bytes=total, used_bytes=0, free_bytes=total, last_heartbeat=time.time(),
                  started_at=started_at or time.time() - 3600)
    state.write_heartbeat(r, g, [], ttl=30)
    return g


def queued_tasks(r: redis.Redis, queue: str) -> list[dict]:
    """Celery messages waiting in a GPU's queue (kombu's Redis transport keeps each queue as a list)."""
    return [json.loads(m)["headers"] for m in r.lrange(queue, 0, -1)]


def ramp(r: redis.Redis, model: str, now: float, seconds: int = 90) -> int:
    """Requests rising from nothing to several per second over the last `seconds`."""
    evs = [(model, 1 + (i * 6) // seconds, now - seconds + i) for i in range(seconds - 3)]
    return traffic.record(r, evs, now=now)


def test_ramp_of_traffic_dispatches_one_preload_with_reason(ctx: Context) -> None:
    g = announce(ctx.r, "node-a", "cpu:0")
    now = time.time()
    ramp(ctx.r, "hot", now)
    sched = Scheduler(ctx, ident="s1")
    res = sched.tick(now)
    assert res.leader and res.dispatched >= 1
    tasks = queued_tasks(ctx.r, g.queue)
    preloads = [t for t in tasks if t["task"] == "prewarm.preload"]
    assert [json.loads(t["argsrepr"].replace("'", '"')) for t in preloads] == [["hot", "v1"]]
    assert ctx.r.exists(keys.intent("hot", g.id))
    ev = [e for e in events.read(ctx.r, kind="preload") if e.model == "hot"]
    assert ev and ev[0].actor == "scheduler" and ev[0].gpu == g.id and "rate" in ev[0].reason
    # The next tick sees the intent in flight and sends nothing more for the same model.
    res2 = sched.tick(now + 2)
    preloads2 = [t for t in queued_tasks(ctx.r, g.queue) if t["task"] == "prewarm.preload"]
    assert len(preloads2) == 1, res2


def test_without_traffic_free_memory_takes_one_unrequested_model_at_a_time(ctx: Context) -> None:
    """No traffic at all: the idle GPU's link takes one fill load, the shortest (other, 16 MiB);
    the next tick sees it in flight and sends nothing more."""
    g = announce(ctx.r, "node-a", "cpu:0")
    sched = Scheduler(ctx, ident="s1")
    now = time.time()
    res = sched.tick(now)
    assert res.leader and res.dispatched == 1
    preloads = [t for t in queued_tasks(ctx.r, g.queue) if t["task"] == "prewarm.preload"]
    assert [json.loads(t["argsrepr"].replace("'", '"')) for t in preloads] == [["other", "v1"]]
    ev = [e for e in events.read(ctx.r, kind="preload") if e.model == "other"]
    assert ev and "no request yet" in ev[0].reason
    assert sched.tick(now + 2).dispatched == 0


def test_with_an_idle_budget_of_zero_models_without_traffic_are_not_loaded(ctx: Context) -> None:
    g = announce(ctx.r, "node-a", "cpu:0")
    settings = Settings.from_env({"PREWARM_REDIS_URL": ctx.settings.redis_url or "",
                                  "PREWARM_CATALOG": str(ctx.settings.catalog), "PREWARM_LEADER_TTL": "1",
                                  "PREWARM_DATA_DIR": str(ctx.settings.data_dir),
                                  "PREWARM_IDLE_MEMORY_BUDGET": "0"})
    res = Scheduler(Context(settings), ident="s1").tick(time.time())
    assert res.leader and res.dispatched == 0
    assert queued_tasks(ctx.r, g.queue) == []


def test_standby_plans_only_after_leader_dies(ctx: Context) -> None:
    announce(ctx.r, "node-a", "cpu:0")
    leader, standby = Scheduler(ctx, ident="s1"), Scheduler(Context(ctx.settings), ident="s2")
    assert leader.tick().leader
    assert not standby.tick().leader
    assert ctx.r.get(keys.LEADER_LOCK) == b"s1"
    # The leader stops ticking (dies) without releasing: the standby takes over once the TTL (1 s) lapses.
    deadline = time.time() + 5
    while not standby.tick().leader:
        assert time.time() < deadline, "standby never took the lead"
        time.sleep(0.2)
    assert ctx.r.get(keys.LEADER_LOCK) == b"s2"
    # The old leader, back from the dead, finds the lock taken and plans nothing.
    assert not leader.tick().leader


def test_two_schedulers_never_dispatch_the_same_action_twice(ctx: Context) -> None:
    g = announce(ctx.r, "node-a", "cpu:0")
    now = time.time()
    ramp(ctx.r, "hot", now)
    first = Scheduler(ctx, ident="s1")
    assert first.tick(now).dispatched >= 1
    first.leadership.release()
    # A second scheduler with its own fresh view plans the same preload; the claimed intent stops it.
    second = Scheduler(Context(ctx.settings), ident="s2")
    res = second.tick(now)
    assert res.leader
    preloads = [t for t in queued_tasks(ctx.r, g.queue) if t["task"] == "prewarm.preload"]
    assert len(preloads) == 1


def test_new_leader_rebuilds_history_from_minute_buckets(ctx: Context) -> None:
    now = time.time()
    traffic.record(ctx.r, [("quiet", 3, now - 3600 + 60 * i) for i in range(50)], now=now)
    sched = Scheduler(ctx, ident="s1")
    sched.tick(now)
    assert sched.reader is not None
    assert sched.reader.history.last_arrival("quiet") is not None


def test_rollout_warms_new_version_before_traffic_shifts(redis_url: str, tmp_path: Path) -> None:
    catalog = write_sized_catalog(tmp_path / "m2", {"chat": 64 * MIB, "chat@v2": 64 * MIB})
    ctx = Context(Settings.from_env({"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog),
                                     "PREWARM_DATA_DIR": str(tmp_path / "var")}))
    now = time.time()
    g = announce(ctx.r, "node-a", "cpu:0")
    announce(ctx.r, "node-b", "cpu:0")
    ready = state.Replica(model="chat", version="v1", gpu=g.id, state="ready", bytes=64 * MIB,
                          total_bytes=64 * MIB, progress=1.0, since=now - 3600, created_at=now - 3600)
    g.used_bytes, g.free_bytes = 64 * MIB, g.total_bytes - 64 * MIB
    state.write_heartbeat(ctx.r, g, [ready], ttl=30)
    traffic.record(ctx.r, [("chat", 3, now - 120 + i) for i in range(115)], now=now)
    sched = Scheduler(ctx, ident="s1")
    sched.tick(now)
    assert not [t for q in ("gpu.node-a.cpu:0", "gpu.node-b.cpu:0") for t in queued_tasks(ctx.r, q)
                if t["task"] == "prewarm.preload" and "v2" in t["argsrepr"]]
    # The router announces that v2 is about to take 30% of the traffic.
    ctx.r.hset(keys.ROLLOUTS, "chat", json.dumps({"version": "v2", "traffic_fraction": 0.3, "since": now}))
    sched.tick(now + 2)
    v2 = [t for q in ("gpu.node-a.cpu:0", "gpu.node-b.cpu:0") for t in queued_tasks(ctx.r, q)
          if t["task"] == "prewarm.preload" and "v2" in t["argsrepr"]]
    assert len(v2) == 1, v2
    assert json.loads(v2[0]["argsrepr"].replace("'", '"')) == ["chat", "v2"]
    # The reported traffic is split between the versions by the fraction.
    hist = sched.reader.history if sched.reader else None
    assert hist is not None
    traffic.record(ctx.r, [("chat", 10, now + 3 + i) for i in range(10)], now=now + 20)
    sched.tick(now + 20)
    assert hist.last_arrival("chat@v2") is not None
    assert 0.2 < hist.rate_short("chat@v2", now + 20) / max(1e-9, hist.rate_short("chat", now + 20)) < 0.6


def test_a_router_waiting_on_a_cold_model_is_demand(ctx: Context) -> None:
    g = announce(ctx.r, "node-a", "cpu:0")
    now = time.time()
    # The route hook answered "cold" for `other` (an open cold start) but no request was reported.
    ctx.r.hset(keys.COLD_STARTS, "other", json.dumps({"seen_at": now - 1, "version": "v1"}))
    res = Scheduler(ctx, ident="s1").tick(now)
    assert res.leader
    preloads = [t for t in queued_tasks(ctx.r, g.queue) if t["task"] == "prewarm.preload"]
    assert [json.loads(t["argsrepr"].replace("'", '"')) for t in preloads] == [["other", "v1"]]


def test_idle_memory_budget_reaches_the_live_policy_and_a_bad_one_is_refused(redis_url: str, tmp_path: Path) -> None:
    base = {"PREWARM_REDIS_URL": redis_url, "PREWARM_DATA_DIR": str(tmp_path / "var")}
    assert Scheduler(Context(Settings.from_env(base)), ident="s1").config.idle_memory_budget is None
    for text, share in (("0.25", 0.25), ("25%", 0.25), ("unlimited", None)):
        ctx = Context(Settings.from_env({**base, "PREWARM_IDLE_MEMORY_BUDGET": text}))
        assert Scheduler(ctx, ident="s1").config.idle_memory_budget == share, text
    with pytest.raises(ValueError, match=r"PREWARM_IDLE_MEMORY_BUDGET='1.5': write a share of each GPU from 0 to 1"):
        Settings.from_env({**base, "PREWARM_IDLE_MEMORY_BUDGET": "1.5"})


def test_a_fill_still_loading_gives_its_link_to_a_demand_load_live(ctx: Context) -> None:
    """The only GPU's link carries a fill (other, never requested, loading); hot is then asked for. The tick
    sends an evict of other (kind yield: the worker cancels a load in flight on an evict) and hot's preload,
    both to that GPU's queue, and records why."""
    now = time.time()
    g = state.Gpu(id=state.gpu_id("node-a", "cpu:0"), node="node-a", device="cpu:0",
                  queue=state.queue_name("node-a", "cpu:0"), total_bytes=1 * GIB, used_bytes=16 * MIB,
                  free_bytes=1 * GIB - 16 * MIB, last_heartbeat=now, started_at=now - 3600)
    fill = state.Replica("other", "v1", g.id, "loading", bytes=4 * MIB, total_bytes=16 * MIB, progress=0.25,
                         since=now - 1, created_at=now - 1, reason="fill")
    state.write_heartbeat(ctx.r, g, [fill], ttl=30)
    ramp(ctx.r, "hot", now)
    res = Scheduler(ctx, ident="s1").tick(now)
    assert res.leader, res
    tasks = [(t["task"], json.loads(t["argsrepr"].replace("'", '"'))[0]) for t in queued_tasks(ctx.r, g.queue)]
    assert ("prewarm.evict", "other") in tasks and ("prewarm.preload", "hot") in tasks, tasks
    ev = [e for e in events.read(ctx.r) if e.model == "other" and e.actor == "scheduler"]
    assert ev and "never requested" in ev[0].reason and "hot" in ev[0].reason, ev


def test_the_process_tick_settles_the_collector_once_per_reader(ctx: Context) -> None:
    """run()'s periodic tick (settled_tick) settles the collector after a reader's first tick (prewarm.heap),
    not on every tick, and again once a new reader (Redis lost and back, a new lead) has built its records."""
    import gc

    before = gc.get_threshold()
    sched = Scheduler(ctx, ident="s1")
    try:
        assert sched.settled_tick() is not None and sched.heap.settles == 1 and gc.get_freeze_count() > 0
        first = sched.reader
        assert sched.settled_tick() is not None and sched.heap.settles == 1
        sched.reader = None  # as safe_tick does when Redis goes away
        assert sched.settled_tick() is not None and sched.reader is not first and sched.heap.settles == 2
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
