"""Faults survived, against real processes (issue 5):

- Redis restarts and loses its data: web answers 503 in words while it is down; once it is back the worker
  re-announces its GPUs and replicas within a heartbeat, the scheduler leads and plans again, and no
  replica is lost track of or double-counted.
- A worker dies (SIGKILL): its GPUs leave the fleet within the heartbeat TTL, routing stops sending there,
  and the scheduler re-places the hot model on the remaining GPUs.
- A task is duplicated by the broker: preload and evict stay idempotent.
- A task is lost: its intent is never confirmed, expires, and the model is planned again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from prewarm import keys, state
from prewarm.celery_app import EVICT, PRELOAD, make_celery
from prewarm.redis_server import EmbeddedRedis
from tests.model_files import tiny_catalog
from tests.procs import start_worker, wait_for
from tests.scheduler_procs import SchedulerProc
from tests.web_support import HookTraffic, WebProc

pytestmark = pytest.mark.slow


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", ["tiny-lm", "tiny-mlp"])


def ready_on(r: redis.Redis, model: str) -> list[str]:
    return [g.id for g in state.read_fleet(r).alive() for x in g.replicas if x.model == model and x.state == "ready"]


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.stop()


def test_redis_restart_losing_data_is_survived(own_redis: EmbeddedRedis, catalog: Path, tmp_path: Path) -> None:
    url = own_redis.url
    w = start_worker(url, catalog, devices="cpu:0=256MiB", node="node-a", log_dir=tmp_path)
    web = WebProc(url, catalog, tmp_path, workers=1)
    # no fill: the test counts the worker's own replicas across the restart, and the scheduler's fill of
    # never-requested models would load tiny-lm beside them whenever it leads (a race with the count)
    sched = SchedulerProc(url, catalog, tmp_path, leader_ttl=2.0, env={"PREWARM_FILL_SHARE": "0"})
    try:
        r = redis.Redis.from_url(url)
        celery = make_celery(url)
        celery.send_task(PRELOAD, args=["tiny-mlp", "v1"], queue=w.queues["node-a/cpu:0"])
        wait_for(lambda: ready_on(r, "tiny-mlp"), 60, what="tiny-mlp ready", log=w.log)
        before = state.read_fleet(r).gpu("node-a/cpu:0")
        assert before is not None
        used_before = before.used_bytes

        own_redis.stop()  # loses everything: no persistence
        code, body = web.get("/api/fleet")
        assert code == 503, body
        msg = json.loads(body)
        assert "redis" in json.dumps(msg).lower()
        code, _ = web.get("/healthz")
        assert code == 503

        restarted = EmbeddedRedis(port=own_redis.port).start()
        own_redis.proc, own_redis.dir = restarted.proc, restarted.dir  # the fixture stops it
        r = redis.Redis.from_url(url)
        wait_for(lambda: ready_on(r, "tiny-mlp") == ["node-a/cpu:0"], 15, what="worker re-announces", log=w.log)
        fleet = state.read_fleet(r)
        gpu = fleet.gpu("node-a/cpu:0")
        assert gpu is not None and gpu.alive
        assert [x.model for x in gpu.replicas] == ["tiny-mlp"]  # not lost, not double-counted
        assert gpu.used_bytes == used_before
        wait_for(lambda: web.get("/api/fleet")[0] == 200, 15, what="web answers again", log=web.log)
        wait_for(sched.is_leader, 15, what="scheduler leads again", log=sched.log)
        t0 = float(r.hget(keys.SCHEDULER_STATUS, "last_tick") or 0)
        wait_for(lambda: float(r.hget(keys.SCHEDULER_STATUS, "last_tick") or 0) > t0, 10,
                 what="scheduler ticking", log=sched.log)
        # The broker came back too: the worker takes tasks again.
        res = celery.send_task(PRELOAD, args=["tiny-lm", "v1"], queue=w.queues["node-a/cpu:0"])
        assert res.get(timeout=60)["state"] == "ready"
    finally:
        sched.stop()
        web.stop()
        w.stop()


def test_killed_worker_leaves_fleet_and_hot_model_is_replaced(redis_url: str, r: redis.Redis, catalog: Path,
                                                              tmp_path: Path) -> None:
    a = start_worker(redis_url, catalog, devices="cpu:0=256MiB", node="node-a", log_dir=tmp_path)
    web = WebProc(redis_url, catalog, tmp_path, workers=1)
    sched = SchedulerProc(redis_url, catalog, tmp_path)
    traffic = HookTraffic(web.url, "tiny-lm")
    b = None
    try:
        wait_for(lambda: ready_on(r, "tiny-lm") == ["node-a/cpu:0"], 60, what="hot model on node-a", log=a.log)
        b = start_worker(redis_url, catalog, devices="cpu:0=256MiB", node="node-b", log_dir=tmp_path)
        a.kill()
        killed = time.monotonic()
        wait_for(lambda: not r.exists(keys.gpu("node-a/cpu:0")), 10, what="node-a leaves the fleet")
        left_after = time.monotonic() - killed
        route = requests.get(f"{web.url}/hooks/route", params={"model": "tiny-lm"}, timeout=10).json()
        assert all(x["gpu"] != "node-a/cpu:0" for x in route["replicas"]), route
        wait_for(lambda: ready_on(r, "tiny-lm") == ["node-b/cpu:0"], 60, what="re-placed on node-b", log=sched.log)
        route = requests.get(f"{web.url}/hooks/route", params={"model": "tiny-lm"}, timeout=10).json()
        assert route["state"] == "ready" and route["replicas"][0]["gpu"] == "node-b/cpu:0"
        print(f"node-a left the fleet {left_after:.1f} s after SIGKILL (TTL 3 s)")
    finally:
        traffic.stop()
        sched.stop()
        web.stop()
        a.kill()
        if b is not None:
            b.stop()


def test_duplicated_tasks_are_idempotent(redis_url: str, r: redis.Redis, catalog: Path, tmp_path: Path) -> None:
    w = start_worker(redis_url, catalog, devices="cpu:0=256MiB", node="node-a", log_dir=tmp_path)
    try:
        celery = make_celery(redis_url)
        q = w.queues["node-a/cpu:0"]
        first = [celery.send_task(PRELOAD, args=["tiny-lm", "v1"], queue=q) for _ in range(3)]
        results = [x.get(timeout=60) for x in first]
        assert all(x["state"] == "ready" for x in results)
        gpu = state.read_fleet(r).gpu("node-a/cpu:0")
        assert gpu is not None and [x.model for x in gpu.replicas] == ["tiny-lm"]
        size = gpu.replicas[0].bytes
        assert gpu.used_bytes == size  # loaded once, counted once
        evicts = [celery.send_task(EVICT, args=["tiny-lm"], queue=q) for _ in range(3)]
        freed = [x.get(timeout=60)["bytes_freed"] for x in evicts]
        assert sorted(freed) == [0, 0, size]
        gpu = state.read_fleet(r).gpu("node-a/cpu:0")
        assert gpu is not None and gpu.replicas == [] and gpu.used_bytes == 0
    finally:
        w.stop()


def test_lost_task_intent_expires_and_model_is_planned_again(redis_url: str, r: redis.Redis, catalog: Path,
                                                             tmp_path: Path) -> None:
    w = start_worker(redis_url, catalog, devices="cpu:0=256MiB", node="node-a", log_dir=tmp_path)
    now = time.time()
    # A preload was dispatched but its task was lost: the intent is there, no task ever arrives.
    lost = state.Intent(action="preload", model="tiny-lm", version="v1", gpu="node-a/cpu:0", actor="scheduler",
                        reason="test: lost task", created_at=now, expires_at=now + 4)
    assert state.claim_intent(r, lost)
    web = WebProc(redis_url, catalog, tmp_path, workers=1)
    sched = SchedulerProc(redis_url, catalog, tmp_path)
    traffic = HookTraffic(web.url, "tiny-lm")
    try:
        wait_for(sched.is_leader, 30, what="scheduler leads", log=sched.log)
        time.sleep(1.0)
        assert ready_on(r, "tiny-lm") == []  # held back by the in-flight intent
        wait_for(lambda: ready_on(r, "tiny-lm"), 60, what="re-planned after the intent expired", log=sched.log)
    finally:
        traffic.stop()
        sched.stop()
        web.stop()
        w.stop()
