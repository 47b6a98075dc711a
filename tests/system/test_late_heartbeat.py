"""A GPU whose heartbeat is late (several beats missed, its records not yet expired) gets no new loads
(issue 24, finding 2.8): the fleet read flags it (state.Fleet.placeable), and the operator's preload and
the scheduler's snapshot choose among the fresh GPUs only, with no fallback to a late one. Real Redis;
the records are written as a worker writes them, with the beat time set back (the route hook's side is
in test_hooks.py, the worker's record in test_worker_residency.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from gpu_worker.sized_catalog import write_sized_catalog
from prewarm import keys, rooms, state
from prewarm.catalog import load_catalog
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.domain.policy import PolicyConfig
from scheduler.live import Scheduler
from scheduler.snapshot import SnapshotReader
from tests import procs
from tests.model_files import tiny_catalog
from tests.procs import wait_for
from tests.web_support import make_context
from web.app import create_app

worker_factory = procs.worker_factory  # the fixture, used by name

MIB = 1024**2
GIB = 1024**3
LATE, FRESH = "node-a/cpu:0", "node-b/cpu:0"
PERIOD = 2.0  # the worker's heartbeat_seconds in these records


def announce(r: redis.Redis, gid: str, total: int, beat_at: float, *, period: float = PERIOD,
             replicas: list[state.Replica] | None = None) -> state.Gpu:
    """A GPU record as its worker writes it, saying it beat at `beat_at`; its key lives 10 minutes."""
    node, _, device = gid.partition("/")
    reps = replicas or []
    used = sum(x.bytes for x in reps)
    g = state.Gpu(id=gid, node=node, device=device, queue=state.queue_name(node, device), total_bytes=total,
                  used_bytes=used, free_bytes=total - used, last_heartbeat=beat_at, started_at=beat_at - 3600,
                  heartbeat_seconds=period)
    state.write_heartbeat(r, g, reps, ttl=600)
    return g


def preloads(r: redis.Redis, gid: str) -> list[list[str]]:
    node, _, device = gid.partition("/")
    heads = [json.loads(m)["headers"] for m in r.lrange(state.queue_name(node, device), 0, -1)]
    return [json.loads(h["argsrepr"].replace("'", '"')) for h in heads if h["task"] == "prewarm.preload"]


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    catalog = write_sized_catalog(tmp_path / "models", {"big": 64 * MIB, "small": 16 * MIB})
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_LEADER_TTL": "5",
           "PREWARM_DATA_DIR": str(tmp_path / "var")}
    return Context(Settings.from_env(env))


def test_the_fleet_read_flags_a_late_heartbeat_by_the_records_own_period(r: redis.Redis) -> None:
    t0 = time.time()
    announce(r, LATE, GIB, t0)
    announce(r, FRESH, GIB, t0, period=0.0)  # a record that gives no period: judged by its TTL alone
    on_time = state.read_fleet(r, now=t0 + state.FRESH_BEATS * PERIOD)
    assert [g.id for g in on_time.placeable()] == [LATE, FRESH]
    late = state.read_fleet(r, now=t0 + state.FRESH_BEATS * PERIOD + 0.5)
    g = late.gpu(LATE)
    assert g is not None and g.alive and not g.fresh and g.heartbeat_seconds == PERIOD
    assert [x.id for x in late.alive()] == [LATE, FRESH]  # still in the fleet until its records expire
    assert [x.id for x in late.placeable()] == [FRESH]
    assert g.public()["fresh"] is False  # /api/fleet and the console say so


def test_the_snapshot_leaves_out_a_late_gpu_even_with_more_free_memory(r: redis.Redis, tmp_path: Path) -> None:
    catalog = load_catalog(write_sized_catalog(tmp_path / "models", {"held": 8 * MIB}))
    now = time.time()
    held = state.Replica(model="held", version="v1", gpu=LATE, state="ready", bytes=8 * MIB, total_bytes=8 * MIB,
                         progress=1.0, since=now - 600, created_at=now - 610)
    announce(r, LATE, 8 * GIB, now - 4 * PERIOD, replicas=[held])  # missed its last beats, records alive
    announce(r, FRESH, 1 * GIB, now)
    snap, fleet = SnapshotReader(r, PolicyConfig()).read(catalog, now)
    assert [g.id for g in snap.gpus] == [FRESH]
    assert [x.gpu for x in snap.replicas] == []  # the policy plans around the late GPU, replicas and all
    assert [g.id for g in fleet.alive()] == [LATE, FRESH]


def test_the_scheduler_sends_no_load_to_a_late_gpu_even_when_only_it_has_room(ctx: Context) -> None:
    now = time.time()
    announce(ctx.r, LATE, 1 * GIB, now - 4 * PERIOD)  # room for both models
    announce(ctx.r, FRESH, 8 * MIB, now)  # room for neither
    sched = Scheduler(ctx, ident="s1")
    res = sched.tick(now)
    assert res.leader and res.dispatched == 0, res
    assert preloads(ctx.r, LATE) == [] and preloads(ctx.r, FRESH) == []
    # Once the late GPU beats again it takes loads (an idle GPU's fill load, the shorter model first).
    announce(ctx.r, LATE, 1 * GIB, now + 1)
    assert sched.tick(now + 1).dispatched == 1
    assert preloads(ctx.r, LATE) == [["small", "v1"]]


def test_an_operator_preload_never_goes_to_a_late_gpu(r: redis.Redis, tmp_path: Path) -> None:
    catalog = load_catalog(write_sized_catalog(tmp_path / "models", {"big": 64 * MIB}))
    entry = catalog.get("big")
    # The late GPU has room and the most free memory; the fresh one has no room. Fresh for minutes and
    # late by 30 s whatever the pace of this test (pick_gpu reads the clock).
    announce(r, LATE, 1 * GIB, time.time() - 30)
    announce(r, FRESH, 32 * MIB, time.time(), period=60.0)
    fleet = state.read_fleet(r)
    # No GPU with a fresh heartbeat has room: the fallback is the fresh one with the most free memory
    # (its worker makes room or refuses, saying why), never the late one.
    assert rooms.pick_gpu(r, fleet, catalog, entry, None, max_loads=2).id == FRESH
    assert rooms.ranked(r, fleet, catalog, entry, max_loads=2) == []
    with pytest.raises(LookupError, match=f"GPU {LATE} takes no new loads while its heartbeat is late"):
        rooms.pick_gpu(r, fleet, catalog, entry, LATE, max_loads=2)
    r.delete(keys.gpu(FRESH))  # the fresh one's worker gone: only the late one is left
    with pytest.raises(LookupError, match=f"no GPU takes new loads now .*heartbeat late: {LATE} last beat"):
        rooms.pick_gpu(r, state.read_fleet(r), catalog, entry, None, max_loads=2)


def test_a_frozen_worker_gets_no_on_demand_load(redis_url: str, r: redis.Redis, tmp_path: Path,
                                                worker_factory) -> None:
    """The finding itself: a real worker SIGSTOPped keeps its GPU in the fleet (TTL 120 s here) while its
    heartbeat goes late; a cold route lookup then sends it nothing. It waits for the heartbeat to be
    late (the worker's own records say so), and asserts no timing."""
    catalog = tiny_catalog(tmp_path / "models", ["tiny-mlp"])
    period = 0.5
    w = worker_factory(catalog, devices="cpu:0=64MiB", heartbeat_seconds=period, heartbeat_ttl=120)
    gid, queue = "node-a/cpu:0", state.queue_name("node-a", "cpu:0")
    client = create_app(make_context(redis_url, catalog)).test_client()

    def late() -> bool:
        g = state.read_fleet(r).gpu(gid)
        return g is not None and g.alive and not g.fresh

    os.kill(w.pid, signal.SIGSTOP)
    try:
        wait_for(late, 30, what="the frozen worker's heartbeat to be late")
        body = client.get("/hooks/route?model=tiny-mlp").get_json()
        assert body["state"] == "cold" and body["preload"]["queued"] is False, body
        assert "heartbeat late" in body["preload"]["message"] and r.llen(queue) == 0
    finally:
        os.kill(w.pid, signal.SIGCONT)
