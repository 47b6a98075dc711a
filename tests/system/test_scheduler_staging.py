"""The live scheduler's I/O for the host-memory staging tier, against a real Redis.

GPUs are announced with real heartbeat records and each node's host cache with the record its worker
publishes (`state.write_node`); promotion times are pushed where the worker pushes them. Stage/unstage
tasks land in a GPU queue of the node in Redis, where the test reads them, as test_scheduler_live.py does.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest
import redis

from gpu_worker.sized_catalog import write_sized_catalog
from prewarm import events, keys, state
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.domain.policy import Intent, NodeState, PolicyConfig, Stage, StagedState, Unstage
from scheduler.live import Scheduler
from scheduler.snapshot import SnapshotReader

MIB = 1024**2
GIB = 1024**3


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    catalog = write_sized_catalog(tmp_path / "models", {"hot": 64 * MIB, "chat": 32 * MIB, "chat@v2": 32 * MIB,
                                                        "other": 16 * MIB})
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_LEADER_TTL": "5",
           "PREWARM_DATA_DIR": str(tmp_path / "var")}
    return Context(Settings.from_env(env))


def announce(r: redis.Redis, node: str, device: str, total: int = 1 * GIB) -> state.Gpu:
    g = state.Gpu(id=state.gpu_id(node, device), node=node, device=device, queue=state.queue_name(node, device),
                  total_bytes=total, used_bytes=0, free_bytes=total, last_heartbeat=time.time(),
                  started_at=time.time() - 3600)
    state.write_heartbeat(r, g, [], ttl=30)
    return g


def announce_node(r: redis.Redis, node: str, staged: list[state.Staged], budget: int = 4 * GIB) -> state.Node:
    """A node's host cache as its worker publishes it (budget, used = what its entries hold)."""
    used = sum(max(x.bytes, x.total_bytes) for x in staged)
    n = state.Node(node=node, budget_bytes=budget, used_bytes=used, free_bytes=budget - used,
                   last_heartbeat=time.time(), worker=f"w-{node}")
    state.write_node(r, n, staged, ttl=30)
    return n


def queued_tasks(r: redis.Redis, queue: str) -> list[dict]:
    """Celery messages waiting in a GPU's queue (kombu's Redis transport keeps each queue as a list)."""
    return [json.loads(m)["headers"] for m in r.lrange(queue, 0, -1)]


def task_call(t: dict) -> tuple[list, dict]:
    return ast.literal_eval(t["argsrepr"]), ast.literal_eval(t["kwargsrepr"])


def staged(model: str, version: str, node: str, at: float, size: int, *, done: int | None = None) -> state.Staged:
    """A host cache entry as the worker publishes it: "staged" with all its bytes, or "staging" with `done`."""
    if done is None:
        return state.Staged(model=model, version=version, node=node, state="staged", bytes=size, total_bytes=size,
                            progress=1.0, staged_at=at)
    return state.Staged(model=model, version=version, node=node, state="staging", bytes=done, total_bytes=size,
                        progress=done / size, staged_at=at)


def read(ctx: Context, now: float) -> tuple:
    return SnapshotReader(ctx.r, PolicyConfig()).read(ctx.catalog, now)


def test_reader_turns_host_caches_into_nodes_and_staged_models(ctx: Context) -> None:
    now = time.time()
    announce(ctx.r, "node-a", "cpu:0")
    announce_node(ctx.r, "node-a", [
        staged("hot", "v1", "node-a", now - 100, 64 * MIB),
        staged("other", "v1", "node-a", now - 1, 16 * MIB, done=4 * MIB),  # still being read
        staged("chat", "v2", "node-a", now - 50, 32 * MIB),  # an old version ("chat" is at v1)
        staged("gone", "v1", "node-a", now - 10, MIB),  # no longer in the catalog
    ], budget=2 * GIB)
    announce_node(ctx.r, "node-b", [], budget=GIB)  # a host cache and no GPU: still a node of the tier
    snap, fleet = read(ctx, now)
    used_a = 64 * MIB + 16 * MIB + 32 * MIB + MIB
    assert snap.nodes == (NodeState(id="node-a", budget_bytes=2 * GIB, free_bytes=2 * GIB - used_a),
                          NodeState(id="node-b", budget_bytes=GIB, free_bytes=GIB))
    assert sorted(snap.staged, key=lambda x: x.model) == [
        # The old version is keyed "<id>@<version>", like an old version resident, with a spec of its own.
        StagedState(model="chat@v2", node="node-a", state="staged", bytes=32 * MIB, since=now - 50, version="v2"),
        StagedState(model="hot", node="node-a", state="staged", bytes=64 * MIB, since=now - 100, version="v1"),
        # Staging counts at its full size: what the cache reserved for it.
        StagedState(model="other", node="node-a", state="staging", bytes=16 * MIB, since=now - 1, version="v1"),
    ]
    assert snap.models["chat@v2"].version == "v2" and snap.models["chat@v2"].min_replicas == 0
    assert "gone" not in snap.models
    # Host memory is not device memory: the GPU's free bytes are unchanged by what is staged.
    assert [(g.id, g.free_bytes) for g in snap.gpus] == [("node-a/cpu:0", GIB)]


def test_a_node_whose_worker_stopped_is_not_in_the_snapshot(ctx: Context) -> None:
    now = time.time()
    announce_node(ctx.r, "node-a", [staged("hot", "v1", "node-a", now - 100, 64 * MIB)])
    ctx.r.delete(keys.host_cache("node-a"))  # its heartbeat TTL lapsed
    snap, _ = read(ctx, now)
    assert snap.nodes == () and snap.staged == ()


def test_promote_times_are_the_median_of_the_recent_ones(ctx: Context) -> None:
    # Pushed as the worker pushes them: newest first, promotions apart from loads from storage.
    for v in (9.0, 0.5, 0.7, 9.5, 0.6):
        ctx.r.lpush(keys.promote_times("hot"), f"{v:.4f}")
    for v in (4.0, 5.0, 6.0):
        ctx.r.lpush(keys.load_times("hot"), f"{v:.4f}")
    ctx.r.lpush(keys.promote_times("other"), "0.3000")
    snap, _ = read(ctx, time.time())
    assert snap.models["hot"].promote_seconds == pytest.approx(0.7)  # median: outliers don't move it
    assert snap.models["hot"].load_seconds == pytest.approx(5.0)  # a promotion never shortens a load
    assert snap.models["other"].promote_seconds == pytest.approx(0.3)
    assert snap.models["other"].load_seconds is None
    assert snap.models["chat"].promote_seconds is None  # never promoted: the policy derives it


def test_only_the_last_20_promotions_count(ctx: Context) -> None:
    for v in [100.0] * 30 + [1.0] * 20:  # the 20 newest are 1.0
        ctx.r.lpush(keys.promote_times("hot"), f"{v:.4f}")
    snap, _ = read(ctx, time.time())
    assert snap.models["hot"].promote_seconds == pytest.approx(1.0)


def test_stage_intents_are_seen_on_their_node(ctx: Context) -> None:
    g = announce(ctx.r, "node-a", "cpu:0")
    announce_node(ctx.r, "node-a", [])
    d = ctx.dispatcher.stage("hot", "v1", g, actor="test", reason="likely soon", kind="likely", value=0.5)
    assert d.sent and ctx.r.exists(keys.intent("hot", state.host_id("node-a")))
    ctx.dispatcher.unstage("chat", "v1", g, actor="test", reason="quiet", kind="quiet")
    ctx.dispatcher.preload("other", "v1", g, actor="test", reason="demand")
    snap, _ = read(ctx, time.time())
    got = sorted((i.model, i.gpu, i.kind, i.bytes, i.version) for i in snap.intents)
    assert got == [("chat", "node-a", "unstage", 32 * MIB, "v1"), ("hot", "node-a", "stage", 64 * MIB, "v1"),
                   ("other", "node-a/cpu:0", "preload", 16 * MIB, "v1")]
    assert all(isinstance(i, Intent) and i.expires_at > time.time() for i in snap.intents)


def leader(ctx: Context, now: float) -> Scheduler:
    """A scheduler that took the lead and read one snapshot (so it knows the catalog's model keys).
    Its tick may send fill preloads (free memory takes models never requested): the tests below
    look at stages and unstages only (`host_tasks`, `host_intents`)."""
    sched = Scheduler(ctx, ident="s1")
    assert sched.tick(now).leader
    return sched


def host_tasks(r: redis.Redis, queue: str) -> list[dict]:
    return [t for t in queued_tasks(r, queue) if t["task"] in ("prewarm.stage", "prewarm.unstage")]


def host_intents(r: redis.Redis) -> list:
    return [i for i in state.read_intents(r) if i.action in ("stage", "unstage")]


def alive(ctx: Context) -> dict[str, state.Gpu]:
    return {g.id: g for g in state.read_fleet(ctx.r).alive()}


def test_a_stage_goes_to_a_gpu_queue_of_its_node_once(ctx: Context) -> None:
    now = time.time()
    a1, a0 = announce(ctx.r, "node-a", "cpu:1"), announce(ctx.r, "node-a", "cpu:0")
    b0 = announce(ctx.r, "node-b", "cpu:0")
    announce_node(ctx.r, "node-a", [])
    announce_node(ctx.r, "node-b", [])
    sched = leader(ctx, now)
    action = Stage(model="hot", node="node-a", kind="likely", reason="likely within the hour",
                   numbers={"p_hot": 0.2}, version="v1", bytes=64 * MIB, value=0.75)
    d = sched.dispatch(action, alive(ctx), now)
    assert d is not None and d.sent and d.gpu == state.host_id("node-a")
    # The node's first alive GPU (sorted by id) carries it; no other queue sees it.
    stages = [t for t in queued_tasks(ctx.r, a0.queue) if t["task"] == "prewarm.stage"]
    intent = json.loads(ctx.r.get(keys.intent("hot", state.host_id("node-a"))))
    assert [task_call(t) for t in stages] == [
        (["hot", "v1"], {"reason": "likely within the hour", "kind": "likely", "value": 0.75,
                         "intent_id": intent["id"], "deadline": intent["expires_at"]})]  # its intent, to check
    assert host_tasks(ctx.r, a1.queue) == [] and host_tasks(ctx.r, b0.queue) == []
    assert intent["action"] == "stage" and intent["actor"] == "scheduler" and intent["task_id"] == stages[0]["id"]
    # Recorded once, by the dispatcher, with who and why.
    ev = [e for e in events.read(ctx.r, kind="stage") if e.model == "hot"]
    assert len(ev) == 1 and ev[0].actor == "scheduler" and ev[0].gpu == "node-a/host"
    assert ev[0].reason == "likely within the hour"
    # Planned again while in flight: the claimed intent stops it, and the next snapshot shows it on the node.
    again = sched.dispatch(action, alive(ctx), now + 2)
    assert again is not None and not again.sent
    assert len([t for t in queued_tasks(ctx.r, a0.queue) if t["task"] == "prewarm.stage"]) == 1
    assert sched.reader is not None
    snap, _ = sched.reader.read(ctx.catalog, now + 2)
    assert [(i.model, i.gpu, i.kind) for i in snap.intents if i.kind in ("stage", "unstage")] == [
        ("hot", "node-a", "stage")]


def test_an_unstage_goes_to_a_gpu_queue_of_its_node(ctx: Context) -> None:
    now = time.time()
    g = announce(ctx.r, "node-a", "cpu:0")
    announce_node(ctx.r, "node-a", [staged("chat", "v2", "node-a", now - 500, 32 * MIB)])
    sched = leader(ctx, now)
    d = sched.dispatch(Unstage(model="chat@v2", node="node-a", kind="quiet", reason="no traffic for an hour",
                               version="v2"), alive(ctx), now)
    assert d is not None and d.sent
    unstages = [t for t in queued_tasks(ctx.r, g.queue) if t["task"] == "prewarm.unstage"]
    intent = json.loads(ctx.r.get(keys.intent("chat", state.host_id("node-a"))))
    assert [task_call(t) for t in unstages] == [(["chat"], {"version": "v2", "reason": "no traffic for an hour",
                                                           "intent_id": intent["id"],
                                                           "deadline": intent["expires_at"]})]
    assert [e.gpu for e in events.read(ctx.r, kind="unstage") if e.model == "chat"] == ["node-a/host"]
    # An unstage is no eviction from a GPU: it starts no reload cooldown.
    assert sched.reader is not None and "chat@v2" not in sched.reader.recent_evictions


def test_a_stage_on_a_node_without_alive_gpus_is_skipped(ctx: Context) -> None:
    now = time.time()
    announce(ctx.r, "node-a", "cpu:0")
    dead = announce(ctx.r, "node-b", "cpu:0")
    ctx.r.delete(keys.gpu(dead.id))  # node-b's GPU stopped heartbeating; its host cache record remains
    announce_node(ctx.r, "node-b", [])
    sched = leader(ctx, now)
    action = Stage(model="hot", node="node-b", kind="likely", reason="likely", version="v1", value=1.0)
    assert sched.dispatch(action, alive(ctx), now) is None
    assert sched.dispatch(Unstage(model="hot", node="node-b", kind="quiet", reason="quiet"), alive(ctx), now) is None
    assert not ctx.r.exists(keys.intent("hot", state.host_id("node-b")))
    assert host_intents(ctx.r) == []
    assert queued_tasks(ctx.r, dead.queue) == [] and host_tasks(ctx.r, "gpu.node-a.cpu:0") == []
    assert events.read(ctx.r, kind="stage") == []


def test_a_stage_of_a_model_not_in_the_snapshot_is_skipped(ctx: Context) -> None:
    now = time.time()
    g = announce(ctx.r, "node-a", "cpu:0")
    sched = leader(ctx, now)
    assert sched.dispatch(Stage(model="gone", node="node-a", kind="likely", reason="x"), alive(ctx), now) is None
    assert host_tasks(ctx.r, g.queue) == [] and host_intents(ctx.r) == []
