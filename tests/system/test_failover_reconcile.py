"""What the scheduler and the worker do once the Redis master changed (a Sentinel failover), on a real Redis.

The failover itself is made the way a promoted replica presents it: prewarm:redis:epoch names another run id
than the master's (the old master's, replicated before it died). The real kill -9 of a Sentinel master is
tests/system/test_sentinel_failover.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from gpu_worker import intents
from gpu_worker.sized_catalog import write_sized_catalog
from prewarm import events, failover, keys, state
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.domain.policy import Evict, Preload
from scheduler import failover as failover_guard
from scheduler.live import Scheduler

MIB = 1024**2
TTL = 3.0


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    catalog = write_sized_catalog(tmp_path / "models", {"alpha": 16 * MIB, "beta": 16 * MIB})
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_LEADER_TTL": "5",
           "PREWARM_HEARTBEAT_TTL": str(TTL), "PREWARM_SPECULATIVE_SHARE": "0",
           "PREWARM_FILL_SHARE": "0",  # plans nothing by itself
           "PREWARM_DATA_DIR": str(tmp_path / "var")}
    return Context(Settings.from_env(env))


def announce(r: redis.Redis, device: str) -> state.Gpu:
    g = state.Gpu(id=state.gpu_id("node-a", device), node="node-a", device=device,
                  queue=state.queue_name("node-a", device), total_bytes=1024 * MIB, used_bytes=0,
                  free_bytes=1024 * MIB, last_heartbeat=time.time(), started_at=time.time() - 3600)
    state.write_heartbeat(r, g, [], ttl=60)
    return g


def fail_over(r: redis.Redis) -> None:
    """What the promoted replica holds: the epoch still names the old master's run id."""
    r.hset(keys.REDIS_EPOCH, "run_id", "0" * 40)


def queued(r: redis.Redis, queue: str) -> list[dict]:
    return [json.loads(m)["headers"] for m in r.lrange(queue, 0, -1)]


def test_the_epoch_tells_a_failover_once_and_a_fresh_redis_is_none(r: redis.Redis) -> None:
    first = failover.observe(r, 100.0)
    assert first.failover_at is None and first.run_id == r.info("server")["run_id"]
    assert failover.observe(r, 101.0).failover_at is None  # the same master: nothing happened
    fail_over(r)
    seen = failover.observe(r, 102.0)
    assert seen.failover_at == 102.0 and seen.previous == "0" * 40
    assert failover.observe(r, 103.0).failover_at == 102.0  # seen once; later looks report that one
    assert failover.recent(r, 10.0, 105.0) is not None and failover.recent(r, 10.0, 200.0) is None


def test_a_lost_preload_is_sent_again_after_the_hold_and_the_hold_keeps_evictions_back(ctx: Context) -> None:
    r = ctx.r
    g = announce(r, "cpu:0")
    now = time.time()
    sched = Scheduler(ctx, ident="s1")
    assert sched.tick(now).leader  # the first look at the epoch
    lost = ctx.dispatcher.preload("alpha", "v1", g, actor="operator", reason="wanted by hand")
    assert lost.sent
    r.delete(g.queue)  # its message did not make it to the new master
    fail_over(r)

    sched.tick(now + 0.5)
    assert r.hget(keys.SCHEDULER_STATUS, "failover_hold") == b"1"
    [opened] = [e for e in events.read(r, kind="failover")]
    assert "evictions held" in opened.reason and opened.numbers["gpus_before"] == [g.id]
    fleet = state.read_fleet(r)
    plan = [Evict("beta", g.id, "make_room", "x"), Preload("beta", g.id, "demand", "y")]
    assert sched.failover.filter(plan, fleet, now + 1.0) == [plan[1]]  # the fleet is whole: only evicts held
    assert state.held_intent(r, "alpha", g.id).id == lost.intent_id  # in flight until the hold ends

    sched.tick(now + 0.5 + TTL + 0.1)  # the hold is over: reconciled
    assert r.hget(keys.SCHEDULER_STATUS, "failover_hold") == b"0"
    again = state.held_intent(r, "alpha", g.id)
    assert again is not None and again.id != lost.intent_id and again.actor == "scheduler"
    assert [t["id"] for t in queued(r, g.queue) if t["task"] == "prewarm.preload"] == [again.task_id]
    closed = events.read(r, kind="failover")[0]
    assert closed.numbers["resent"] == [f"sent again the preload of alpha@v1 on {g.id}"]
    assert sched.failover.filter(plan, fleet, now + 10) == plan  # nothing held any more


def test_a_preload_still_queued_is_left_alone(ctx: Context) -> None:
    r = ctx.r
    g = announce(r, "cpu:0")
    now = time.time()
    sched = Scheduler(ctx, ident="s1")
    sched.tick(now)
    waiting = ctx.dispatcher.preload("alpha", "v1", g, actor="operator", reason="queued")
    fail_over(r)
    sched.tick(now + 0.5)
    sched.tick(now + 0.5 + TTL + 0.1)
    assert state.held_intent(r, "alpha", g.id).id == waiting.intent_id
    assert events.read(r, kind="failover")[0].numbers["resent"] == []


def test_a_standby_sees_the_failover_and_only_one_scheduler_records_it(ctx: Context) -> None:
    announce(ctx.r, "cpu:0")
    now = time.time()
    a, b = Scheduler(ctx, ident="a"), Scheduler(ctx, ident="b")
    assert a.tick(now).leader and not b.tick(now).leader
    fail_over(ctx.r)
    assert not b.tick(now + 0.5).leader  # the standby is first to look: the epoch is swapped by it
    assert a.tick(now + 0.6).leader  # the leader still sees the failover it has not acted on
    assert len(events.read(ctx.r, kind="failover")) == 1
    assert ctx.r.hget(keys.SCHEDULER_STATUS, "failover_hold") == b"1"


def test_the_leader_takes_a_vanished_lock_again_and_steps_down_if_it_was_taken(ctx: Context) -> None:
    a, b = Scheduler(ctx, ident="a"), Scheduler(ctx, ident="b")
    assert a.leadership.ensure()
    ctx.r.delete(keys.LEADER_LOCK)  # not replicated before the master died
    assert a.leadership.ensure() and ctx.r.get(keys.LEADER_LOCK) == b"a"
    ctx.r.delete(keys.LEADER_LOCK)
    assert b.leadership.ensure()  # a standby got there first
    assert not a.leadership.ensure() and ctx.r.get(keys.LEADER_LOCK) == b"b"


def test_a_task_whose_intent_the_failover_lost_runs_and_claims_it_again(r: redis.Redis) -> None:
    now = time.time()
    failover.observe(r, now - 10)
    args = ("alpha", "node-a/cpu:0", "intent-1", now + 60)
    assert intents.stale_reason(r, *args, now, action="preload", version="v1", intent_ttl=120) is not None
    fail_over(r)
    assert intents.stale_reason(r, *args, now, action="preload", version="v1", intent_ttl=120) is None
    held = state.held_intent(r, "alpha", "node-a/cpu:0")
    assert held is not None and held.id == "intent-1" and held.action == "preload"
    # another intent for the same (model, GPU) since: superseded as ever
    r.delete(keys.intent("alpha", "node-a/cpu:0"))
    other = state.Intent("evict", "alpha", "v1", "node-a/cpu:0", "operator", "x", now, now + 60, id="intent-2")
    assert state.claim_intent(r, other)
    assert "superseded" in intents.stale_reason(r, *args, now, action="preload", version="v1", intent_ttl=120)


def claimed_never_sent(r: redis.Redis, g: state.Gpu, model: str, *, at: float) -> state.Intent:
    """What a leader killed between claiming an intent and publishing its task leaves behind."""
    i = state.Intent(action="preload", model=model, version="v1", gpu=g.id, actor="scheduler",
                     reason="a load ahead", created_at=at, expires_at=at + 120, kind="speculative",
                     id="dead-leader-intent", task_id="never-published")
    [(claimed, _)] = state.claim_intents(r, [(i, ())])
    assert claimed
    return i


def test_a_preload_a_killed_leader_claimed_and_never_sent_is_sent_again_by_the_next_leader(ctx: Context) -> None:
    r = ctx.r
    g = announce(r, "cpu:0")
    now = time.time()
    assert Scheduler(ctx, ident="a").tick(now).leader
    dead = claimed_never_sent(r, g, "alpha", at=now + 0.1)
    waiting = ctx.dispatcher.preload("beta", "v1", g, actor="scheduler", reason="sent, still in its queue")
    r.delete(keys.LEADER_LOCK)  # "a" was killed: its lock ran out
    b = Scheduler(ctx, ident="b")
    assert b.tick(now + 1.0).leader
    assert state.held_intent(r, "alpha", g.id).id == dead.id  # not judged before the grace
    b.tick(now + 1.0 + failover_guard.LOST_TASK_GRACE_S + 0.1)
    again = state.held_intent(r, "alpha", g.id)
    assert again is not None and again.id != dead.id and again.actor == "scheduler" and again.kind == "speculative"
    tasks = [t["id"] for t in queued(r, g.queue) if t["task"] == "prewarm.preload"]
    assert again.task_id in tasks and waiting.task_id in tasks  # the queued one was left alone
    assert state.held_intent(r, "beta", g.id).id == waiting.intent_id
    [took] = [e for e in events.read(r, kind="leader") if "never sent" in e.reason]
    assert took.numbers["resent"] == [f"sent again the preload of alpha@v1 on {g.id}"]
    # once a term: an intent claimed later (a live router's, say) is not judged by this term again
    later = claimed_never_sent(r, g, "gamma", at=now + 20)
    b.tick(now + 30)
    assert state.held_intent(r, "gamma", g.id).id == later.id


def test_a_preload_delivered_to_a_worker_and_not_acknowledged_is_left_alone(ctx: Context) -> None:
    """A task a worker has taken from its queue and not acknowledged yet (acks_late: it runs) sits in kombu's
    `unacked` hash, not in the queue: it is in flight, not lost."""
    r = ctx.r
    g = announce(r, "cpu:0")
    now = time.time()
    assert Scheduler(ctx, ident="a").tick(now).leader
    taken = ctx.dispatcher.preload("alpha", "v1", g, actor="scheduler", reason="delivered")
    raw = r.rpop(g.queue)  # what kombu's Redis transport does on delivery: the message moves to `unacked`
    assert raw is not None and not queued(r, g.queue)
    r.hset("unacked", "tag-1", json.dumps([json.loads(raw), "", g.queue]))
    r.delete(keys.LEADER_LOCK)
    b = Scheduler(ctx, ident="b")
    b.tick(now + 1.0)
    b.tick(now + 1.0 + failover_guard.LOST_TASK_GRACE_S + 0.1)
    assert state.held_intent(r, "alpha", g.id).id == taken.intent_id
    assert not [e for e in events.read(r, kind="leader") if "never sent" in e.reason]
