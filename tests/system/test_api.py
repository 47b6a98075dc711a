"""JSON API, console pages, login and CSRF against a real Redis (the fleet is published as heartbeats)."""

from __future__ import annotations

import base64
import json
import re
import statistics
import time
from pathlib import Path

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient

from prewarm import celery_app, events, keys, state, traffic
from prewarm.store import load_times
from prewarm.store import policy as running_policy
from prewarm.store.ready import replica_ready
from scheduler.snapshot import measured_seconds
from tests.web_support import MIB, make_catalog, make_context, publish_gpu, queued_tasks, replica
from web.app import create_app

ADMIN = "admin-t0ken"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
GPU_A, GPU_B = "node-a/cpu:0", "node-b/cpu:0"


@pytest.fixture
def app(redis_url: str, tmp_path: Path) -> Flask:
    return create_app(make_context(redis_url, make_catalog(tmp_path / "models"), admin_token=ADMIN))


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def _csrf(client: FlaskClient, path: str = "/login") -> str:
    html = client.get(path).get_data(as_text=True)
    m = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, f"no CSRF token on {path}"
    return m.group(1)


def _login(client: FlaskClient) -> str:
    resp = client.post("/login", data={"token": ADMIN, "csrf_token": _csrf(client), "next": "/fleet"})
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/fleet")
    return _csrf(client, "/fleet")


def test_healthz(client: FlaskClient) -> None:
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.get_json() == {"status": "ok"}


def test_models_names_the_catalog_entries_a_worker_refused(client: FlaskClient, r: redis.Redis) -> None:
    # A worker's node record carries what it refused of its catalog (its own files, its own imports):
    # web names those beside its own problems, each prefixed with the node.
    problem = "model 'delta': weights 'x.safetensors' lie outside the model roots ['/srv/models']"
    state.write_node(r, state.Node(node="node-b", budget_bytes=0, used_bytes=0, free_bytes=0,
                                   last_heartbeat=time.time(), worker="w1", catalog_problems={"delta": problem}),
                     [], 30)
    body = client.get("/api/models").get_json()
    assert body["catalog_problems"] == {"delta": f"node node-b: {problem}"}
    nodes = client.get("/api/fleet").get_json()["nodes"]
    assert [n["catalog_problems"] for n in nodes] == [{"delta": problem}]


def test_fleet_shows_memory_split_and_stale_gpus(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, total_mib=10, replicas=[replica("alpha", GPU_A, "ready", mib=1),
                                                   replica("beta", GPU_A, "loading", mib=2, progress=0.5)])
    r.sadd(keys.GPUS, "node-z/cpu:0")  # announced once, heartbeat gone: stale
    body = client.get("/api/fleet").get_json()
    gpus = {g["id"]: g for g in body["gpus"]}
    a = gpus[GPU_A]
    assert a["alive"] is True and a["memory"] == {"ready": MIB, "loading": 2 * MIB, "evicting": 0, "free": 7 * MIB}
    assert a["speculative_budget_bytes"] == int(10 * MIB * 0.6)
    assert {x["model"]: x["state"] for x in a["replicas"]} == {"alpha": "ready", "beta": "loading"}
    assert gpus["node-z/cpu:0"]["alive"] is False


def test_fleet_shows_node_host_caches_and_staged_models(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, total_mib=10)
    staged = state.Staged(model="alpha", version="v1", node="node-a", state="staged", bytes=3 * MIB,
                          total_bytes=3 * MIB, progress=1.0, value=2.0, staged_at=time.time())
    state.write_node(r, state.Node(node="node-a", budget_bytes=8 * MIB, used_bytes=3 * MIB, free_bytes=5 * MIB,
                                   last_heartbeat=time.time(), worker="w"), [staged], ttl=30)
    now = time.time()
    state.claim_intent(r, state.Intent("stage", "beta", "v1", state.host_id("node-a"), "scheduler", "likely",
                                       now, now + 60))
    body = client.get("/api/fleet").get_json()
    (n,) = body["nodes"]
    assert n["node"] == "node-a" and n["host_cache"]["free_bytes"] == 5 * MIB
    assert [(x["model"], x["state"], x["bytes"]) for x in n["staged"]] == [("alpha", "staged", 3 * MIB)]
    assert [(i["action"], i["model"]) for i in n["intents"]] == [("stage", "beta")]
    assert all(g["intents"] == [] for g in body["gpus"])  # a host-cache intent is no GPU's


def test_models_have_rates_totals_replicas_and_sparklines(client: FlaskClient, r: redis.Redis) -> None:
    now = time.time()
    traffic.record(r, [("alpha", 30, now - 10), ("alpha", 30, now - 20), ("beta", 1, now - 5)])
    publish_gpu(r, GPU_A, replicas=[replica("alpha", GPU_A, "ready")])
    r.lpush(keys.load_times("alpha"), *[str(x) for x in (1.0, 2.0, 3.0, 4.0, 10.0)])
    r.hset(keys.LAST_COLD_START, "alpha", "2.500")
    r.sadd(keys.PINNED, "beta")
    models = {m["id"]: m for m in client.get("/api/models").get_json()["models"]}
    assert set(models) == {"alpha", "beta", "gamma"}
    a = models["alpha"]
    assert a["requests_total"] == 60 and a["rate_per_s"] == pytest.approx(1.0)
    assert a["replicas"][0]["gpu"] == GPU_A and a["replicas"][0]["state"] == "ready"
    assert a["p95_load_s"] == 10.0 and a["last_cold_start_s"] == 2.5
    assert a["sparkline"]["resolution_s"] == 60 and len(a["sparkline"]["counts"]) == 60
    assert sum(a["sparkline"]["counts"]) == 60
    assert models["beta"]["pinned"] is True and models["gamma"]["requests_total"] == 0
    assert client.get("/api/models?window=abc").status_code == 400


def test_load_times_shown_are_the_ones_the_scheduler_plans_with(client: FlaskClient, r: redis.Redis) -> None:
    """One limit, one reader: the console's p95 and sample count cover the same recent loads as the
    scheduler's median, however many the worker recorded."""
    for i in range(load_times.KEPT + 5):  # as the worker records them, oldest first: 0 s, 1 s, ...
        rep = replica("alpha", GPU_A, "ready")
        rep.load_seconds, rep.warmup_seconds = float(i), 0.0
        replica_ready(r, rep)
    a = next(m for m in client.get("/api/models").get_json()["models"] if m["id"] == "alpha")
    kept = [float(i) for i in range(5, load_times.KEPT + 5)]
    assert a["load_samples"] == load_times.KEPT == len(kept)
    assert a["p95_load_s"] == kept[-2]  # the 19th of 20 sorted
    assert measured_seconds(r, ["alpha"])[0] == {"alpha": statistics.median(kept)}


def test_actions_refuse_without_credentials(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, replicas=[replica("alpha", GPU_A, "ready")])
    for action in ("preload", "evict", "pin", "unpin"):
        for headers in ({}, {"Authorization": "Bearer nope"}):
            resp = client.post(f"/api/models/alpha/{action}", headers=headers)
            assert resp.status_code == 401, action
            assert "admin" in resp.get_json()["error"].lower() and ADMIN not in resp.get_data(as_text=True)
    assert queued_tasks(r, "gpu.node-a.cpu:0") == [] and not r.exists(keys.PINNED)


def test_actions_are_disabled_without_an_admin_token(redis_url: str, tmp_path: Path) -> None:
    client = create_app(make_context(redis_url, make_catalog(tmp_path / "m"))).test_client()
    resp = client.post("/api/models/alpha/pin", headers={"Authorization": "Bearer anything"})
    assert resp.status_code == 403 and "PREWARM_ADMIN_TOKEN" in resp.get_json()["error"]


def test_preload_and_evict_through_the_dispatcher(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, total_mib=8)
    publish_gpu(r, GPU_B, total_mib=16)
    resp = client.post("/api/models/beta/preload", json={"gpu": GPU_A, "reason": "warm for a demo"}, headers=AUTH)
    assert resp.status_code == 202, resp.get_json()
    assert resp.get_json()["gpu"] == GPU_A and resp.get_json()["queued"] is True
    tasks = queued_tasks(r, "gpu.node-a.cpu:0")
    assert len(tasks) == 1 and tasks[0]["headers"]["task"] == celery_app.PRELOAD
    again = client.post("/api/models/beta/preload", json={"gpu": GPU_A}, headers=AUTH)
    assert again.status_code == 409 and "in flight" in again.get_json()["error"]
    # Without a gpu: the placement rule's choice, GPU_B (GPU_A has beta's preload in flight).
    assert client.post("/api/models/alpha/preload", headers=AUTH).get_json()["gpu"] == GPU_B
    ev = events.read(r, model="beta")[0]
    assert (ev.kind, ev.actor, ev.gpu, ev.reason) == ("preload", "operator", GPU_A, "warm for a demo")

    assert client.post("/api/models/gamma/evict", headers=AUTH).status_code == 409  # not resident
    publish_gpu(r, GPU_B, total_mib=16, replicas=[replica("gamma", GPU_B, "ready", mib=4)])
    resp = client.post("/api/models/gamma/evict", json={}, headers=AUTH)
    assert resp.status_code == 202 and resp.get_json()["evictions"][0]["gpu"] == GPU_B
    names = sorted(t["headers"]["task"] for t in queued_tasks(r, "gpu.node-b.cpu:0"))
    assert names == [celery_app.EVICT, celery_app.PRELOAD]
    assert events.read(r, model="gamma", actor="operator")[0].kind == "evict"


def _kwargs(task: dict) -> dict:
    return json.loads(base64.b64decode(task["body"]))[1]  # Celery's message body: [args, kwargs, embed]


def test_evict_of_a_loading_model_cancels_its_preload_and_a_refusal_is_409(client: FlaskClient,
                                                                          r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, total_mib=16)
    q = "gpu.node-a.cpu:0"
    # 1. A preload dispatched, not yet a replica: the evict takes over its intent and cancels it.
    assert client.post("/api/models/beta/preload", json={"gpu": GPU_A}, headers=AUTH).status_code == 202
    preload = json.loads(r.get(keys.intent("beta", GPU_A)))
    resp = client.post("/api/models/beta/evict", json={"gpu": GPU_A}, headers=AUTH)
    assert resp.status_code == 202, resp.get_json()
    (ev,) = resp.get_json()["evictions"]
    assert ev["queued"] is True and ev["cancels"] == "preload"
    assert "cancels the preload of beta@v1 (operator: operator preload from the console)" in ev["message"]
    evict = json.loads(r.get(keys.intent("beta", GPU_A)))
    assert evict["action"] == "evict" and evict["id"] != preload["id"]
    preload_task, evict_task = queued_tasks(r, q)[::-1]  # LPUSHed: newest first
    assert evict_task["headers"]["task"] == celery_app.EVICT and _kwargs(evict_task)["supersedes"] == preload["id"]
    assert _kwargs(preload_task)["intent_id"] == preload["id"], "every task carries its intent's id"
    # 2. Refused while that evict is in flight: a 409 naming the refused action and the one in flight.
    pre = client.post("/api/models/beta/preload", json={"gpu": GPU_A}, headers=AUTH)
    assert pre.status_code == 409 and "preload of beta@v1 on node-a/cpu:0 refused: evict of beta@v1" in \
        pre.get_json()["error"]
    publish_gpu(r, GPU_A, total_mib=16, replicas=[replica("beta", GPU_A, "ready", mib=2)])
    again = client.post("/api/models/beta/evict", json={"gpu": GPU_A}, headers=AUTH)
    assert again.status_code == 409
    assert again.get_json()["error"] == ("evict of beta@v1 on node-a/cpu:0 refused: evict of beta@v1 (operator: "
                                         "operator evict from the console) is in flight there; try again once it "
                                         "has ended")
    # 3. A loading replica (its preload intent held): the evict is sent and cancels it.
    publish_gpu(r, GPU_A, total_mib=16, replicas=[replica("alpha", GPU_A, "loading", mib=2, progress=0.3)])
    now = time.time()
    assert state.claim_intent(r, state.Intent("preload", "alpha", "v1", GPU_A, "scheduler", "rising", now, now + 60,
                                              id="p1"))
    resp = client.post("/api/models/alpha/evict", headers=AUTH)
    assert resp.status_code == 202 and resp.get_json()["evictions"][0]["cancels"] == "preload"
    assert _kwargs(queued_tasks(r, q)[0])["supersedes"] == "p1"


@pytest.mark.parametrize("url, body, status, field", [
    ("/api/models/nope/preload", {}, 404, "model"),
    ("/api/models/alpha/preload", {"gpu": "node-q/cuda:7"}, 422, "gpu"),
    ("/api/models/alpha/preload", {"version": "v9"}, 422, "version"),
    ("/api/models/alpha/preload", {"gpu": 5}, 422, "gpu"),
    ("/api/models/alpha/preload", {"path": "/etc/passwd"}, 422, "path"),
    ("/api/models/alpha/evict", {"gpu": "nowhere"}, 422, "gpu"),
])
def test_action_bad_input(client: FlaskClient, r: redis.Redis, url: str, body: dict, status: int,
                          field: str) -> None:
    publish_gpu(r, GPU_A)
    resp = client.post(url, json=body, headers=AUTH)
    assert resp.status_code == status, resp.get_json()
    assert resp.get_json()["field"] == field


def test_a_null_action_body_names_the_object_expected(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A)
    for action in ("preload", "evict"):
        resp = client.post(f"/api/models/alpha/{action}", data="null", content_type="application/json",
                           headers=AUTH)
        assert resp.status_code == 400, resp.get_json()
        assert resp.get_json()["error"] == 'body: a JSON object {"gpu"?, "version"?, "reason"?} is required'
    assert not state.read_intents(r)  # nothing dispatched


def test_preload_with_no_fleet_is_a_conflict(client: FlaskClient) -> None:
    resp = client.post("/api/models/alpha/preload", headers=AUTH)
    assert resp.status_code == 409 and "no GPU" in resp.get_json()["error"]


def test_pin_and_unpin(client: FlaskClient, r: redis.Redis) -> None:
    assert client.post("/api/models/alpha/pin", headers=AUTH).get_json()["pinned"] is True
    assert r.sismember(keys.PINNED, "alpha")
    assert client.post("/api/models/alpha/unpin", headers=AUTH).get_json()["pinned"] is False
    assert not r.sismember(keys.PINNED, "alpha")
    assert [e.kind for e in events.read(r, model="alpha")] == ["unpin", "pin"]


def test_events_filters(client: FlaskClient, r: redis.Redis) -> None:
    events.record(r, "preload", "scheduler", model="alpha", gpu=GPU_A, reason="rate rising",
                  numbers={"rate": 3.1})
    events.record(r, "evict", "operator", model="beta", gpu=GPU_B, reason="manual")
    assert len(client.get("/api/events").get_json()["events"]) == 2
    only = client.get("/api/events?model=alpha").get_json()["events"]
    assert len(only) == 1 and only[0]["numbers"] == {"rate": 3.1}
    assert [e["model"] for e in client.get(f"/api/events?gpu={GPU_B}").get_json()["events"]] == ["beta"]
    assert [e["model"] for e in client.get("/api/events?actor=scheduler").get_json()["events"]] == ["alpha"]
    for bad in ("0", "²", "-1", "99999", "x"):
        assert client.get(f"/api/events?limit={bad}").status_code == 400


# --- console -----------------------------------------------------------------------------------------
def test_pages_render_read_only_without_login(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, replicas=[replica("alpha", GPU_A, "loading", progress=0.3)])
    r.sadd(keys.GPUS, "node-z/cpu:0")
    events.record(r, "preload", "scheduler", model="alpha", gpu=GPU_A, reason="forecast 12/s in 40 s")
    fleet = client.get("/fleet").get_data(as_text=True)
    assert GPU_A in fleet and "STALE" in fleet and 'data-state="loading"' in fleet
    assert "Log in" in fleet and "Preload" not in fleet  # no action forms for anonymous visitors
    assert "alpha" in client.get("/models").get_data(as_text=True)
    assert "forecast 12/s in 40 s" in client.get("/events?model=alpha").get_data(as_text=True)
    assert client.get("/").status_code == 302


def test_the_fleet_says_which_expert_orders_evictions_and_whether_loads_ahead_go_on(
        client: FlaskClient, r: redis.Redis) -> None:
    """What the leader's no-regret layer and loads-ahead record said at its last tick (the scheduler's status
    hash, written each tick: test_scheduler_isolation), in /api/fleet and on the console's fleet page."""
    publish_gpu(r, GPU_A)
    assert client.get("/api/fleet").get_json()["policy"]["expert"] == ""  # no scheduler has led yet
    assert client.get("/api/fleet").get_json()["policy"]["fills"] == ""
    assert client.get("/api/fleet").get_json()["policy"]["link_waits"] == ""
    assert client.get("/api/fleet").get_json()["policy"]["stale_rates"] == ""
    assert 'id="expert-line"' not in client.get("/fleet").get_data(as_text=True)
    running_policy.swap(r, "prewarm", "s1")
    why = "expert lru leads (lru on trial against prewarm in turns (prewarm's victims cost 0.2000, lru's 0.1000)"
    fills = "fills keep to the speculative share: 1.0 asked for while resident, 5.0 evicted unasked (decayed)"
    waits = "1 demand load(s) wait for a busy link: beta for n1/cuda:0's link (free in about 3 s)"
    stale = ("silent models keep their measured rate: of the silences that refuted a model's rate lately, 2.0 went "
             "on (stops) and 9.0 ended within as long again (pauses), decayed over 6 h")
    r.hset(keys.SCHEDULER_STATUS, mapping={"expert": why, "loads_ahead": "loads ahead held back: on this traffic",
                                           "fills": fills, "link_waits": waits, "stale_rates": stale})
    policy = client.get("/api/fleet").get_json()["policy"]
    assert policy["expert"] == why and policy["loads_ahead"].startswith("loads ahead held back")
    assert policy["fills"] == fills and policy["link_waits"] == waits and policy["stale_rates"] == stale
    page = client.get("/fleet").get_data(as_text=True)
    assert "eviction order: expert lru leads (lru on trial against prewarm" in page
    assert "loads ahead held back" in page and 'id="fills-line"' in page and fills in page
    assert 'id="link-waits-line"' in page and "beta for n1/cuda:0&#39;s link" in page
    assert 'id="stale-rates-line"' in page and "9.0 ended within as long again" in page


def test_a_gpu_whose_heartbeat_is_late_is_marked_in_the_fleet(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, heartbeat_seconds=2.0, beat_age_s=30.0, ttl=600)  # missed its beats, records alive
    publish_gpu(r, GPU_B, heartbeat_seconds=60.0)
    gpus = {g["id"]: g for g in client.get("/api/fleet").get_json()["gpus"]}
    assert gpus[GPU_A]["alive"] and not gpus[GPU_A]["fresh"] and gpus[GPU_A]["heartbeat_seconds"] == 2.0
    assert gpus[GPU_B]["fresh"]
    fleet = client.get("/fleet").get_data(as_text=True)
    assert fleet.count("late · no new loads") == 1 and "STALE" not in fleet


def test_the_fleet_names_the_base_replica_an_adapter_lives_in(client: FlaskClient, r: redis.Redis) -> None:
    adapter = replica("alpha-lora", GPU_A, "ready")
    adapter.host = "alpha@v1"  # a LoRA adapter's replica, loaded into the engine of alpha@v1 (issue 29)
    publish_gpu(r, GPU_A, replicas=[replica("alpha", GPU_A, "ready"), adapter])
    fleet = client.get("/fleet").get_data(as_text=True)
    assert fleet.count('data-host="alpha@v1"') == 1 and "in alpha@v1</span>" in fleet  # the base itself has no host


def test_login_wrong_token_and_csrf(client: FlaskClient) -> None:
    assert client.post("/login", data={"token": ADMIN}).status_code == 403  # no CSRF token
    resp = client.post("/login", data={"token": "wrong", "csrf_token": _csrf(client)})
    assert resp.status_code == 401 and "not the admin token" in resp.get_data(as_text=True)
    resp = client.post("/login", data={"token": ADMIN, "csrf_token": _csrf(client), "next": "https://evil.example/"})
    assert resp.status_code == 302 and resp.headers["Location"] == "/fleet"  # no open redirect


def test_console_actions_need_csrf(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A)
    token = _login(client)
    resp = client.post("/actions/alpha/pin", data={"next": "/models"})
    assert resp.status_code == 403 and not r.sismember(keys.PINNED, "alpha")
    # The JSON API with a session cookie but no CSRF header is refused too.
    assert client.post("/api/models/alpha/pin").status_code == 403
    resp = client.post("/actions/alpha/pin", data={"csrf_token": token, "next": "/models"})
    assert resp.status_code == 302 and r.sismember(keys.PINNED, "alpha")
    resp = client.post("/api/models/alpha/unpin", headers={"X-CSRF-Token": token})
    assert resp.status_code == 200 and not r.sismember(keys.PINNED, "alpha")


def test_console_preload_and_evict_forms(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A)
    token = _login(client)
    fleet = client.get("/fleet").get_data(as_text=True)
    assert 'data-action="preload"' in fleet
    resp = client.post("/actions/preload", data={"csrf_token": token, "model": "alpha", "gpu": GPU_A,
                                                 "next": "/fleet"}, follow_redirects=True)
    assert "preload of alpha queued on node-a/cpu:0" in resp.get_data(as_text=True)
    assert len(queued_tasks(r, "gpu.node-a.cpu:0")) == 1
    resp = client.post("/actions/gamma/evict", data={"csrf_token": token, "next": "/fleet"}, follow_redirects=True)
    assert "not resident" in resp.get_data(as_text=True)


def test_logout(client: FlaskClient, r: redis.Redis) -> None:
    token = _login(client)
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302
    resp = client.post("/actions/alpha/pin", data={"csrf_token": token})
    assert resp.status_code == 302 and "/login" in resp.headers["Location"]
    assert not r.sismember(keys.PINNED, "alpha")


def test_unknown_paths_and_methods_answer_in_json(client: FlaskClient) -> None:
    resp = client.get("/api/nothing")
    assert resp.status_code == 404 and "no such page" in resp.get_json()["error"]
    resp = client.get("/api/models/alpha/pin")
    assert resp.status_code == 405 and "POST" in resp.headers["Allow"]


def test_trend_forecast_follows_the_sparkline() -> None:
    from web.api import trend_forecast

    assert trend_forecast([0] * 59) == [0.0] * 10
    flat = trend_forecast([30] * 59)
    assert all(f == pytest.approx(30, abs=0.01) for f in flat)
    ramp = trend_forecast(list(range(0, 118, 2)))  # +2 requests/min every minute
    assert ramp[0] > 116 and ramp[-1] > ramp[0]
    falling = trend_forecast(list(range(118, 0, -2)))
    assert falling[0] <= 2.0 and falling[-1] == 0.0  # never below zero


def test_models_api_has_the_forecast(client: FlaskClient, r: redis.Redis) -> None:
    now = time.time()
    traffic.record(r, [("alpha", 10 * (i + 1), now - 60 * (30 - i)) for i in range(30)])
    alpha = next(m for m in client.get("/api/models").get_json()["models"] if m["id"] == "alpha")
    assert len(alpha["sparkline"]["forecast"]) == 10 and alpha["sparkline"]["forecast"][0] > 200
    assert "forecast" in client.get("/models").get_data(as_text=True)


def test_a_preload_without_a_gpu_goes_where_the_placement_rule_says(client: FlaskClient, r: redis.Redis) -> None:
    """The API picks with the route hook's and the planner's rule (prewarm.rooms): a node holding the
    model staged first, else the tightest fit, not the most free memory."""
    publish_gpu(r, GPU_A, total_mib=64)
    publish_gpu(r, GPU_B, total_mib=16)
    publish_gpu(r, "node-c/cpu:0", total_mib=32)
    state.write_node(r, state.Node(node="node-c", budget_bytes=8 * MIB, used_bytes=MIB, free_bytes=7 * MIB),
                     [state.Staged(model="alpha", version="v1", node="node-c", state="staged", bytes=MIB)], ttl=30)
    assert client.post("/api/models/alpha/preload", headers=AUTH).get_json()["gpu"] == "node-c/cpu:0"
    assert client.post("/api/models/beta/preload", headers=AUTH).get_json()["gpu"] == GPU_B
