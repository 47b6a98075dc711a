"""A baseline policy on the real system: Redis, a worker loading real weights, web (gunicorn) and a
`prewarm scheduler` process started with PREWARM_POLICY=on-demand-lru."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
import requests

from prewarm import events, keys, state
from prewarm.catalog import load_catalog
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.scheduler_procs import SchedulerProc
from tests.web_support import WebProc

pytestmark = pytest.mark.slow

MODELS = ["tiny-lm", "tiny-lm-bf16", "tiny-mlp"]


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", MODELS)


def ready(r: redis.Redis, model: str) -> bool:
    return any(x.state == "ready" for x in state.read_fleet(r).replicas(model))


def route(web: WebProc, model: str) -> dict:
    return requests.get(f"{web.url}/hooks/route", params={"model": model}, timeout=10).json()


def test_on_demand_lru_loads_on_a_cold_lookup_and_evicts_the_least_recently_used(
        redis_url, r, catalog, web, schedulers, tmp_path, worker_factory) -> None:  # noqa: F811
    a, b, c = MODELS
    sizes = {m: load_catalog(catalog).get(m).size_bytes for m in MODELS}
    # one GPU that holds any two of the three models, never all three
    w = worker_factory(catalog, devices=f"cpu:0={sum(sizes.values()) - 1}")
    sched = SchedulerProc(redis_url, catalog, tmp_path, env={"PREWARM_POLICY": "on-demand-lru"})
    schedulers.append(sched)
    wait_for(sched.is_leader, 30, what="scheduler leadership", log=sched.log)
    fleet = requests.get(f"{web.url}/api/fleet", timeout=10).json()
    assert fleet["policy"]["name"] == "on-demand-lru" and fleet["policy"]["source"] == "scheduler"
    for m in (a, b):  # a cold lookup loads it (the route hook's on-demand preload: there is room)
        assert route(web, m)["state"] == "cold"
        wait_for(lambda m=m: ready(r, m), 60, what=f"{m} ready", log=w.log)
    # a is used after b loaded: b is the least recently used (the traffic store counts per second, so the
    # report goes in a later second than b's load start)
    b_start = max(x.created_at for x in state.read_fleet(r).replicas(b))
    wait_for(lambda: time.time() >= int(b_start) + 1, 5, what="the second after b's load started")
    assert requests.post(f"{web.url}/hooks/requests", json={"model": a, "count": 3},
                         timeout=10).status_code == 202
    posted = time.time()
    wait_for(lambda: float(r.hget(keys.SCHEDULER_STATUS, "last_tick") or 0) > posted + 3, 30,
             what="a tick that has read the reported requests", log=sched.log)
    assert route(web, c)["state"] == "cold"  # no room: the hook places nothing, the scheduler makes room
    wait_for(lambda: ready(r, c), 60, what=f"{c} ready", log=lambda: sched.log() + w.log())
    assert ready(r, a) and not state.read_fleet(r).replicas(b)
    (ev,) = [e for e in events.read(r, kind="evict") if e.model == b]
    assert ev.actor == "scheduler" and ev.reason.startswith(f"on-demand-lru: making room for {c}"), ev
    assert not [e for e in events.read(r, kind="evict") if e.model == a]
    loads = [e for e in events.read(r, kind="preload") if e.model == c]
    assert loads and loads[-1].actor == "scheduler", loads
