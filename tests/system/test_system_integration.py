"""The whole system with real processes: Redis, a worker, web (gunicorn) and schedulers.

- a ramp of requests reported to /hooks/requests gets the model ready with no route call at all;
- a route call for a cold model enqueues exactly one preload, however many calls come;
- killing the leader scheduler lets the standby plan within the lock TTL.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
import requests

from prewarm import events, state
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.scheduler_procs import SchedulerProc
from tests.web_support import WebProc

pytestmark = pytest.mark.slow


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", ["tiny-lm", "tiny-mlp", "tiny-lm-wide"])


def replica_state(r: redis.Redis, model: str) -> str | None:
    reps = state.read_fleet(r).replicas(model)
    return next((x.state for x in reps if x.state == "ready"), reps[0].state if reps else None)


def post(web: WebProc, body: dict) -> requests.Response:
    return requests.post(f"{web.url}/hooks/requests", json=body, timeout=10)


def test_ramp_of_hook_traffic_warms_model_before_any_route_call(redis_url, r, catalog, web, schedulers, tmp_path,
                                                                worker_factory) -> None:  # noqa: F811
    w = worker_factory(catalog, devices="cpu:0=256MiB,cpu:1=256MiB")
    schedulers.append(SchedulerProc(redis_url, catalog, tmp_path))
    wait_for(lambda: schedulers[0].is_leader(), 30, what="scheduler leadership", log=schedulers[0].log)
    accepted = 0
    # A ramp: 1, 2, 3 ... requests per half second, as the router reports them.
    for step in range(1, 13):
        resp = post(web, {"events": [{"model": "tiny-lm", "count": 1}] * step})
        assert resp.status_code == 202, resp.text
        accepted += resp.json()["accepted"]
        if replica_state(r, "tiny-lm") == "ready":
            break
        time.sleep(0.5)
    wait_for(lambda: replica_state(r, "tiny-lm") == "ready", 60, what="tiny-lm ready", log=w.log)
    evs = [e for e in events.read(r, model="tiny-lm") if e.kind == "preload"]
    assert evs and all(e.actor == "scheduler" for e in evs), evs
    assert "rate" in evs[-1].reason or "request" in evs[-1].reason
    # Nobody asked /hooks/route: no router action and no lookup counted.
    assert not [e for e in events.read(r) if e.actor == "router" and e.kind == "preload"]
    metrics = requests.get(f"{web.url}/metrics", timeout=10).text
    lookups = [ln for ln in metrics.splitlines() if ln.startswith("prewarm_route_lookups_total{")]
    assert lookups and all(float(ln.rsplit(" ", 1)[1]) == 0 for ln in lookups), lookups
    # The route hook now answers ready, listing the warm replica.
    route = requests.get(f"{web.url}/hooks/route", params={"model": "tiny-lm"}, timeout=10).json()
    assert route["state"] == "ready" and route["replicas"][0]["state"] == "ready"
    assert route["replicas"][0]["gpu"] in w.gpu_ids


def test_route_for_cold_model_enqueues_exactly_one_preload(redis_url, r, catalog, web, worker_factory) -> None:  # noqa: F811
    w = worker_factory(catalog, devices="cpu:0=256MiB")
    answers = [requests.get(f"{web.url}/hooks/route", params={"model": "tiny-mlp"}, timeout=10).json()
               for _ in range(8)]
    assert answers[0]["state"] in ("cold", "loading")
    wait_for(lambda: replica_state(r, "tiny-mlp") == "ready", 60, what="tiny-mlp ready", log=w.log)
    for _ in range(3):
        requests.get(f"{web.url}/hooks/route", params={"model": "tiny-mlp"}, timeout=10)
    preloads = [e for e in events.read(r, model="tiny-mlp") if e.kind == "preload"]
    assert len(preloads) == 1 and preloads[0].actor == "router", preloads


def test_standby_scheduler_plans_after_leader_is_killed(redis_url, r, catalog, web, schedulers, tmp_path,
                                                        worker_factory) -> None:  # noqa: F811
    w = worker_factory(catalog, devices="cpu:0=256MiB,cpu:1=256MiB")
    leader = SchedulerProc(redis_url, catalog, tmp_path / "a", leader_ttl=2.0)
    schedulers.append(leader)
    wait_for(leader.is_leader, 30, what="first scheduler leads", log=leader.log)
    standby = SchedulerProc(redis_url, catalog, tmp_path / "b", leader_ttl=2.0)
    schedulers.append(standby)
    time.sleep(1.5)
    assert leader.is_leader() and not standby.is_leader()
    leader.kill()
    killed_at = time.monotonic()
    wait_for(standby.is_leader, 15, what="standby takes the lead", log=standby.log)
    took = time.monotonic() - killed_at
    # ... and it plans: reported traffic gets a model loaded by the new leader.
    assert post(web, {"model": "tiny-lm-wide", "count": 5}).status_code == 202
    wait_for(lambda: replica_state(r, "tiny-lm-wide") == "ready", 60, what="standby's preload ready",
             log=lambda: f"{w.log()[-2000:]}\n--- standby's log (tail) ---\n{standby.log()[-2000:]}")
    evs = [e for e in events.read(r, model="tiny-lm-wide") if e.kind == "preload"]
    assert evs and evs[0].actor == "scheduler"
    print(f"standby took the lead {took:.1f} s after the leader was killed (TTL 2 s)")
