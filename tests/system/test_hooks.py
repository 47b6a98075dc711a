"""The request router's hooks against a real Redis (no worker: the fleet is published as heartbeats)."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from prewarm import celery_app, events, keys, state, traffic
from prewarm.catalog_entries import Catalog
from tests.model_files import HOSTILE, write_hostile_header
from tests.procs import wait_for
from tests.web_support import MIB, WebProc, make_catalog, make_context, publish_gpu, queued_tasks, replica
from web.app import create_app
from web.schemas import MAX_BATCH

GPU = "node-a/cpu:0"
QUEUE = "gpu.node-a.cpu:0"


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return make_catalog(tmp_path / "models", extra_versions={"alpha": ["v2"]})


@pytest.fixture
def client(redis_url: str, catalog: Path) -> FlaskClient:
    app = create_app(make_context(redis_url, catalog))
    return app.test_client()


@dataclass(frozen=True)
class Ago:
    """A timestamp this many seconds before the test runs (negative: in the future). Parameter lists are
    built at collection, which on a slow run is many minutes before the test: a time read there goes stale."""

    seconds: float
    whole: bool = False

    def at(self, now: float) -> float | int:
        return int(now) - int(self.seconds) if self.whole else now - self.seconds


def at_run(value: object) -> object:
    """`value` with every Ago in it read against the clock now."""
    if isinstance(value, Ago):
        return value.at(time.time())
    if isinstance(value, dict):
        return {k: at_run(v) for k, v in value.items()}
    if isinstance(value, list):
        return [at_run(v) for v in value]
    return value


# --- POST /hooks/requests ---------------------------------------------------------------------------
def test_single_event_and_batch_are_recorded(client: FlaskClient, r: redis.Redis) -> None:
    resp = client.post("/hooks/requests", json={"model": "alpha"})
    assert resp.status_code == 202 and resp.get_json() == {"accepted": 1, "requests": 1}
    resp = client.post("/hooks/requests", json={"events": [{"model": "alpha", "count": 3, "ts": time.time() - 2},
                                                           {"model": "beta", "count": 2}]})
    assert resp.status_code == 202 and resp.get_json() == {"accepted": 2, "requests": 5}
    assert traffic.totals(r) == {"alpha": 4, "beta": 2}
    assert traffic.read_seconds(r, time.time() - 10, time.time() + 1).total("alpha") == 4


@pytest.mark.parametrize("body, status, field", [
    ({"model": "nope"}, 422, "model"),
    ({"events": [{"model": "alpha"}, {"model": "nope"}]}, 422, "events[1].model"),
    ({"events": [{"model": "alpha", "count": -1}]}, 422, "events[0].count"),
    ({"events": [{"model": "alpha", "count": 1.5}]}, 422, "events[0].count"),
    ({"events": [{"model": "alpha", "count": "1"}]}, 422, "events[0].count"),
    ({"events": [{"model": "alpha", "count": True}]}, 422, "events[0].count"),
    ({"events": [{"model": "alpha", "ts": Ago(-86400)}]}, 422, "events[0].ts"),
    ({"events": [{"model": "alpha", "ts": "yesterday"}]}, 422, "events[0].ts"),
    ({"events": [{"model": "alpha", "colour": "red"}]}, 422, "events[0].colour"),
    ({"events": []}, 422, "events"),
    ({"events": "alpha"}, 422, "events"),
    ({"count": 1}, 422, "model"),
    ([{"model": "alpha"}], 422, "body"),
])
def test_bad_events_are_refused_naming_the_field(client: FlaskClient, r: redis.Redis, body: object,
                                                 status: int, field: str) -> None:
    resp = client.post("/hooks/requests", json=at_run(body))
    assert resp.status_code == status, resp.get_json()
    data = resp.get_json()
    assert data["field"] == field and data["error"].startswith(field)
    assert traffic.totals(r) == {}  # all-or-nothing: nothing of a refused batch is recorded


def test_nan_and_infinite_timestamps_are_refused(client: FlaskClient, r: redis.Redis) -> None:
    for raw in ('{"model": "alpha", "ts": NaN}', '{"events": [{"model": "alpha", "ts": Infinity}]}'):
        resp = client.post("/hooks/requests", data=raw, content_type="application/json")
        assert resp.status_code == 422 and "ts" in resp.get_json()["field"]
    assert traffic.totals(r) == {}


def test_malformed_and_missing_json(client: FlaskClient) -> None:
    resp = client.post("/hooks/requests", data="{not json", content_type="application/json")
    assert resp.status_code == 400 and resp.get_json()["error"] == "body: malformed JSON"
    assert client.post("/hooks/requests").status_code == 400
    resp = client.post("/hooks/requests", data="model=alpha", content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 415 and "Content-Type" in resp.get_json()["error"]


@pytest.mark.parametrize("path, names", [("/hooks/requests", ['"model"', '"events"']),
                                         ("/hooks/rollout", ['"model"', '"version"', '"traffic_fraction"'])])
def test_a_null_body_names_the_object_expected(client: FlaskClient, r: redis.Redis, path: str,
                                               names: list[str]) -> None:
    resp = client.post(path, data="null", content_type="application/json")
    assert resp.status_code == 400, resp.get_json()
    error = resp.get_json()["error"]
    assert error.startswith("body: a JSON object {") and all(n in error for n in names), error
    assert "malformed" not in error and resp.get_json()["field"] == "body"
    resp = client.post(path, data="7", content_type="application/json")  # other JSON that is no object
    assert resp.status_code == 422 and all(n in resp.get_json()["error"] for n in names)
    assert traffic.totals(r) == {} and not r.exists(keys.ROLLOUTS)


def _post_chunked(web: WebProc, path: str, chunks: Iterator[bytes]) -> tuple[int, dict]:
    """POST with Transfer-Encoding: chunked (no Content-Length), as a streaming client sends."""
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=60)
    try:
        conn.request("POST", path, body=chunks, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _batch_chunks(events: int, per_chunk: int = 4096) -> Iterator[bytes]:
    """A JSON batch of `events` events, sent in chunks of `per_chunk` events (about 76 KiB)."""
    yield b'{"events": ['
    for start in range(0, events, per_chunk):
        n = min(per_chunk, events - start)
        yield b",".join([b'{"model": "alpha"}'] * n) + (b"," if start + n < events else b"")
    yield b"]}"


def test_a_chunked_body_over_the_limit_is_a_413(web: WebProc, r: redis.Redis) -> None:
    status, body = _post_chunked(web, "/hooks/requests", _batch_chunks(3))
    assert status == 202 and body["accepted"] == 3  # a chunked body within the limit is read whole
    big = 10 * 1000 * 1000 // len(b'{"model": "alpha"},')  # about 10 MB of events
    status, body = _post_chunked(web, "/hooks/requests", _batch_chunks(big))
    assert status == 413 and body["error"] == "body: larger than 8 MiB", body
    filler = b'{"model": "alpha", "version": "v2", "traffic_fraction": 0.5, "pad": "' + b"x" * 10_000_000 + b'"}'
    status, body = _post_chunked(web, "/hooks/rollout", iter([filler[i:i + 65536]
                                                              for i in range(0, len(filler), 65536)]))
    assert status == 413, body
    assert traffic.totals(r) == {"alpha": 3} and not r.exists(keys.ROLLOUTS)


def test_oversize_batch_is_refused_whole(client: FlaskClient, r: redis.Redis) -> None:
    resp = client.post("/hooks/requests", json={"events": [{"model": "alpha"}] * (MAX_BATCH + 1)})
    assert resp.status_code == 413 and resp.get_json()["field"] == "events"
    assert traffic.totals(r) == {}
    resp = client.post("/hooks/requests", json={"events": [{"model": "alpha"}] * MAX_BATCH})
    assert resp.status_code == 202 and traffic.totals(r) == {"alpha": MAX_BATCH}


def test_concurrent_posts_count_exactly(redis_url: str, catalog: Path, r: redis.Redis) -> None:
    app = create_app(make_context(redis_url, catalog))
    accepted = []
    lock = threading.Lock()

    def work(i: int) -> None:
        c = app.test_client()
        for j in range(40):
            body = {"events": [{"model": "alpha", "count": 1 + (i + j) % 4}, {"model": "beta", "count": 1}]}
            resp = c.post("/hooks/requests", json=body)
            assert resp.status_code == 202
            with lock:
                accepted.append(resp.get_json()["requests"])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(traffic.totals(r).values()) == sum(accepted) and len(accepted) == 320


def test_hook_token_is_required_when_set(redis_url: str, catalog: Path, r: redis.Redis) -> None:
    client = create_app(make_context(redis_url, catalog, hook_token="s3cret-hook")).test_client()
    for method, url, body in (("post", "/hooks/requests", {"model": "alpha"}), ("get", "/hooks/route?model=alpha", None),
                              ("post", "/hooks/rollout", {"model": "alpha", "version": "v2", "traffic_fraction": 0.1})):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-hook"}):
            resp = getattr(client, method)(url, json=body, headers=headers)
            assert resp.status_code == 401, (url, headers)
            assert "PREWARM_HOOK_TOKEN" in resp.get_json()["error"] and "s3cret" not in resp.get_data(as_text=True)
    assert traffic.totals(r) == {} and not r.exists(keys.ROLLOUTS)
    ok = client.post("/hooks/requests", json={"model": "alpha"}, headers={"Authorization": "Bearer s3cret-hook"})
    assert ok.status_code == 202


# --- GET /hooks/route -------------------------------------------------------------------------------
def test_route_lists_ready_replicas_first(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, "node-a/cpu:0", replicas=[replica("alpha", "node-a/cpu:0", "loading", progress=0.4)])
    publish_gpu(r, "node-b/cpu:0", replicas=[replica("alpha", "node-b/cpu:0", "ready")])
    publish_gpu(r, "node-c/cpu:0", replicas=[replica("alpha", "node-c/cpu:0", "failed")])
    resp = client.get("/hooks/route?model=alpha")
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["state"] == "ready" and body["model"] == "alpha" and body["version"] == "v1"
    assert [(x["gpu"], x["state"]) for x in body["replicas"]] == [("node-b/cpu:0", "ready"),
                                                                  ("node-a/cpu:0", "loading")]
    assert body["replicas"][0]["queue"] == "gpu.node-b.cpu:0" and body["replicas"][1]["progress"] == 0.4
    assert "preload" not in body


def test_route_loading_does_not_enqueue(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "warming", progress=1.0)])
    body = client.get("/hooks/route?model=alpha").get_json()
    assert body["state"] == "loading" and "preload" not in body
    assert queued_tasks(r, QUEUE) == []


def test_cold_model_gets_exactly_one_preload(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU)
    first = client.get("/hooks/route?model=beta").get_json()
    assert first["state"] == "cold" and first["replicas"] == []
    assert first["preload"]["queued"] is True and first["preload"]["gpu"] == GPU
    for _ in range(5):
        again = client.get("/hooks/route?model=beta").get_json()
        # The preload is in flight (an intent): the model is reported as loading, nothing more is sent.
        assert again["state"] == "loading" and "preload" not in again
    tasks = queued_tasks(r, QUEUE)
    assert len(tasks) == 1 and tasks[0]["headers"]["task"] == celery_app.PRELOAD
    evs = events.read(r, model="beta")
    assert [(e.kind, e.actor) for e in evs] == [("preload", "router")]
    assert r.hexists(keys.COLD_STARTS, "beta")


def test_cold_claim_prevents_a_second_preload_even_without_an_intent(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU)
    client.get("/hooks/route?model=beta")
    for k in r.scan_iter(match=keys.INTENT_PATTERN):  # the intent expired, the claim did not
        r.delete(k)
    body = client.get("/hooks/route?model=beta").get_json()
    assert body["state"] == "cold" and body["preload"]["queued"] is False
    assert len(queued_tasks(r, QUEUE)) == 1


def test_concurrent_cold_lookups_enqueue_one_preload(redis_url: str, catalog: Path, r: redis.Redis) -> None:
    publish_gpu(r, GPU)
    app = create_app(make_context(redis_url, catalog))
    barrier = threading.Barrier(8)

    def look() -> None:
        c = app.test_client()
        barrier.wait()
        assert c.get("/hooks/route?model=gamma").status_code == 200

    threads = [threading.Thread(target=look) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(queued_tasks(r, QUEUE)) == 1


def test_concurrent_cold_lookups_of_different_models_do_not_fill_one_gap_twice(
        redis_url: str, catalog: Path, r: redis.Redis) -> None:
    publish_gpu(r, GPU, total_mib=5)  # room for gamma (4 MiB) or beta (2 MiB), not both
    app = create_app(make_context(redis_url, catalog))
    barrier = threading.Barrier(8)
    answers: list[dict] = []

    def look(model: str) -> None:
        c = app.test_client()
        barrier.wait()
        answers.append(c.get(f"/hooks/route?model={model}").get_json())

    threads = [threading.Thread(target=look, args=("gamma" if i % 2 else "beta",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(queued_tasks(r, QUEUE)) == 1
    assert sum(1 for a in answers if a.get("preload", {}).get("queued")) == 1


def test_cold_with_no_room_says_why_and_sends_nothing(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, total_mib=3)  # gamma needs 4 MiB
    body = client.get("/hooks/route?model=gamma").get_json()
    assert body["state"] == "cold" and body["preload"]["queued"] is False
    assert "free" in body["preload"]["message"]
    assert queued_tasks(r, QUEUE) == [] and not r.exists(keys.cold_claim("gamma@v1"))


def test_cold_lookups_do_not_send_two_preloads_into_one_gap(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, total_mib=5)  # room for gamma (4 MiB) or beta (2 MiB), not both
    first = client.get("/hooks/route?model=gamma").get_json()
    assert first["preload"]["queued"] is True
    # gamma's preload is in flight but not yet a replica: the GPU's measured free bytes do not show it.
    second = client.get("/hooks/route?model=beta").get_json()
    assert second["preload"]["queued"] is False and "free" in second["preload"]["message"]
    assert [t["headers"]["argsrepr"] for t in queued_tasks(r, QUEUE)] == ["['gamma', 'v1']"]


def test_a_preload_queued_for_a_load_slot_still_counts_against_free_memory(client: FlaskClient,
                                                                            r: redis.Redis) -> None:
    publish_gpu(r, GPU, total_mib=5)  # room for gamma (4 MiB) or beta (2 MiB), not both
    assert client.get("/hooks/route?model=gamma").get_json()["preload"]["queued"] is True
    # the worker shows gamma as a `pending` placeholder (waiting for a load slot): it owns no memory
    # yet, so the GPU still measures 5 MiB free, and beta must not be sent into gamma's bytes
    publish_gpu(r, GPU, total_mib=5, replicas=[replica("gamma", GPU, "pending", mib=0)])
    second = client.get("/hooks/route?model=beta").get_json()
    assert second["preload"]["queued"] is False and "free" in second["preload"]["message"]


def test_cold_start_closes_when_ready(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU)
    client.get("/hooks/route?model=alpha")
    seen_at = json.loads(r.hget(keys.COLD_STARTS, "alpha"))["seen_at"]
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "ready", since=seen_at + 2.5)])
    assert client.get("/hooks/route?model=alpha").get_json()["state"] == "ready"
    assert not r.hexists(keys.COLD_STARTS, "alpha")
    assert float(r.hget(keys.LAST_COLD_START, "alpha")) == pytest.approx(2.5, abs=0.01)


def test_on_demand_preload_prefers_a_node_holding_a_staged_copy(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, total_mib=64)
    publish_gpu(r, "node-b/cpu:0", total_mib=32)  # less free memory, but the model is staged on node-b
    staged = [state.Staged(model="beta", version="v1", node="node-b", state="staged", bytes=MIB),
              state.Staged(model="alpha", version="v2", node="node-b", state="staged", bytes=MIB)]
    state.write_node(r, state.Node(node="node-b", budget_bytes=8 * MIB, used_bytes=2 * MIB, free_bytes=6 * MIB),
                     staged, ttl=30)
    body = client.get("/hooks/route?model=beta").get_json()
    assert body["state"] == "cold" and body["preload"]["gpu"] == "node-b/cpu:0"
    assert len(queued_tasks(r, "gpu.node-b.cpu:0")) == 1 and queued_tasks(r, QUEUE) == []
    assert events.read(r, model="beta")[0].numbers["staged"] is True
    # A copy of another version does not count: alpha@v1 goes to GPU, whose link is idle (node-b now
    # has beta's preload in flight).
    body = client.get("/hooks/route?model=alpha").get_json()
    assert body["preload"]["gpu"] == GPU


def test_on_demand_preload_prefers_a_gpu_with_a_free_load_slot(redis_url: str, catalog: Path,
                                                                r: redis.Redis) -> None:
    # GPU has the most free memory but runs two loads (the default PREWARM_MAX_LOADS_PER_GPU): a
    # third would queue behind them, so the on-demand preload goes to node-b, which runs none.
    # Links shared (PREWARM_LINK_WAIT=0): the second lookup finds both links busy, which the link wait leaves to the
    # scheduler (test_routing_service).
    client = create_app(make_context(redis_url, catalog, link_wait=False)).test_client()
    publish_gpu(r, GPU, total_mib=64, replicas=[replica("alpha", GPU, "loading", progress=0.3),
                                                replica("gamma", GPU, "warming", mib=4)])
    publish_gpu(r, "node-b/cpu:0", total_mib=32)
    body = client.get("/hooks/route?model=beta").get_json()
    assert body["state"] == "cold" and body["preload"]["gpu"] == "node-b/cpu:0"
    # node-b now has one preload in flight (an intent, not yet a replica) and GPU one load: both have
    # a free slot and one load, so the placement rule's tightest fit wins: node-b (30 MiB free once
    # beta's 2 MiB are counted) over GPU (60 MiB), keeping the large gap for a large model
    publish_gpu(r, GPU, total_mib=64, replicas=[replica("gamma", GPU, "warming", mib=4)])
    body = client.get("/hooks/route?model=alpha").get_json()
    assert body["preload"]["gpu"] == "node-b/cpu:0"
    assert len(queued_tasks(r, "gpu.node-b.cpu:0")) == 2 and queued_tasks(r, QUEUE) == []


def test_route_for_a_version(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU)
    publish_gpu(r, "node-b/cpu:0", total_mib=32)
    assert client.get("/hooks/route?model=alpha").get_json()["preload"]["queued"] is True  # v1, cold
    body = client.get("/hooks/route?model=alpha&version=v2").get_json()  # the claim is per version
    assert body["version"] == "v2" and body["state"] == "cold" and body["preload"]["queued"] is True
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "ready", version="v2")])
    assert client.get("/hooks/route?model=alpha&version=v2").get_json()["state"] == "ready"
    assert client.get("/hooks/route?model=alpha").get_json()["state"] == "loading"  # v1 still in flight
    tasks = queued_tasks(r, QUEUE) + queued_tasks(r, "gpu.node-b.cpu:0")
    assert len(tasks) == 2 and {t["headers"]["task"] for t in tasks} == {celery_app.PRELOAD}


def test_on_demand_preload_skips_a_gpu_whose_heartbeat_is_late(client: FlaskClient, r: redis.Redis) -> None:
    # GPU's worker beats every 2 s but last beat 30 s ago (stopped?), its records alive for minutes more;
    # the placement rule would pick it (the tightest fit), so the preload goes to node-b, which beats.
    publish_gpu(r, GPU, total_mib=8, heartbeat_seconds=2.0, beat_age_s=30.0, ttl=600)
    publish_gpu(r, "node-b/cpu:0", total_mib=64, heartbeat_seconds=60.0)  # (fresh for minutes: no race)
    body = client.get("/hooks/route?model=beta").get_json()
    assert body["state"] == "cold" and body["preload"]["queued"] is True
    assert body["preload"]["gpu"] == "node-b/cpu:0"
    assert queued_tasks(r, QUEUE) == [] and len(queued_tasks(r, "gpu.node-b.cpu:0")) == 1


def test_on_demand_preload_sends_nothing_when_only_a_late_gpu_has_room(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, total_mib=64, heartbeat_seconds=2.0, beat_age_s=30.0, ttl=600)  # late, room for gamma
    publish_gpu(r, "node-b/cpu:0", total_mib=3, heartbeat_seconds=60.0)  # fresh, but gamma needs 4 MiB
    body = client.get("/hooks/route?model=gamma").get_json()
    assert body["state"] == "cold" and body["preload"]["queued"] is False
    message = body["preload"]["message"]
    assert "no GPU has 4.0 MiB free" in message and f"heartbeat late: {GPU} last beat" in message, message
    assert queued_tasks(r, QUEUE) == [] and queued_tasks(r, "gpu.node-b.cpu:0") == []
    assert not r.exists(keys.cold_claim("gamma@v1"))  # nothing sent: the next lookup tries again
    # The late GPU stays in the fleet (its records have not expired): only new loads pass it over.
    assert [g.id for g in state.read_fleet(r).alive()] == [GPU, "node-b/cpu:0"]


@pytest.mark.parametrize("query, status, field", [
    ("", 400, "model"), ("?model=nope", 404, "model"), ("?model=alpha&version=v9", 404, "version"),
    ("?model=" + "x" * 300, 400, "model"),
])
def test_route_bad_queries(client: FlaskClient, query: str, status: int, field: str) -> None:
    resp = client.get("/hooks/route" + query)
    assert resp.status_code == status and resp.get_json()["field"] == field


def test_route_with_no_fleet_is_cold(client: FlaskClient) -> None:
    body = client.get("/hooks/route?model=alpha").get_json()
    assert body["state"] == "cold" and body["preload"]["queued"] is False
    assert "no GPU" in body["preload"]["message"]


# --- POST /hooks/rollout -----------------------------------------------------------------------------
def test_rollout_is_stored_for_the_scheduler(client: FlaskClient, r: redis.Redis) -> None:
    resp = client.post("/hooks/rollout", json={"model": "alpha", "version": "v2", "traffic_fraction": 0.25})
    assert resp.status_code == 202
    rec = json.loads(r.hget(keys.ROLLOUTS, "alpha"))
    assert rec["version"] == "v2" and rec["traffic_fraction"] == 0.25 and rec["from_version"] == "v1"
    evs = events.read(r, kind="rollout")
    assert len(evs) == 1 and evs[0].actor == "router" and "25%" in evs[0].reason


@pytest.mark.parametrize("body, field", [
    ({"model": "alpha", "version": "v9", "traffic_fraction": 0.5}, "version"),
    ({"model": "nope", "version": "v2", "traffic_fraction": 0.5}, "model"),
    ({"model": "alpha", "version": "v2", "traffic_fraction": 1.5}, "traffic_fraction"),
    ({"model": "alpha", "version": "v2"}, "traffic_fraction"),
    ({"model": "alpha", "version": "../../etc", "traffic_fraction": 0.5}, "version"),
])
def test_rollout_bad_input(client: FlaskClient, r: redis.Redis, body: dict, field: str) -> None:
    resp = client.post("/hooks/rollout", json=body)
    assert resp.status_code == 422 and resp.get_json()["field"] == field
    assert not r.exists(keys.ROLLOUTS)


def test_deeply_nested_json_is_a_400(client: FlaskClient, r: redis.Redis) -> None:
    resp = client.post("/hooks/requests", data="[" * 100_000 + "]" * 100_000, content_type="application/json")
    assert resp.status_code == 400 and resp.get_json()["field"] == "body"
    assert traffic.totals(r) == {}


def test_absurd_numbers_are_422_not_500(client: FlaskClient, r: redis.Redis) -> None:
    for raw in ('{"model": "alpha", "ts": 1%s}' % ("0" * 400), '{"model": "alpha", "count": 1%s}' % ("0" * 400),
                '{"model": "alpha", "ts": -1e400}'):
        resp = client.post("/hooks/requests", data=raw, content_type="application/json")
        assert resp.status_code == 422, resp.get_json()
    assert traffic.totals(r) == {}


@pytest.mark.parametrize("event", [
    {"model": "alpha"}, {"model": "alpha", "count": 0}, {"model": "alpha", "count": 1_000_000, "ts": Ago(0)},
    {"model": "alpha", "ts": Ago(60, whole=True)}, {"model": "alpha", "ts": None},
    {"model": ""}, {"model": "a" * 129}, {"model": "-x"}, {"model": 7}, {"model": "alpha", "count": 1_000_001},
    {"model": "alpha", "count": 2.0}, {"model": "alpha", "count": False}, {"model": "alpha", "ts": True},
    {"model": "alpha", "ts": 10**400}, {"model": "alpha", "ts": float("nan")}, {"model": "alpha", "ts": "1"},
    {"model": "alpha", "ts": Ago(9 * 86400)}, {"model": "alpha", "extra": 1}, {"count": 1}, "alpha", None,
])
def test_the_fast_batch_validator_agrees_with_the_published_schema(event: object) -> None:
    # The hook validates batches with REQUEST_BATCH (plain dicts, 5x faster); openapi.json publishes
    # RequestBatch. Both must accept the same events and name the same field with the same words.
    from pydantic import ValidationError

    from web.schemas import REQUEST_BATCH, RequestBatch, describe

    body = {"events": [{"model": "beta"}, at_run(event)]}
    try:
        published = [e.model_dump() for e in RequestBatch.model_validate(body).events]
    except ValidationError as exc:
        published = describe(exc)
    try:
        fast = [{"count": 1, "ts": None, **e} for e in REQUEST_BATCH.validate_python(body)["events"]]
    except ValidationError as exc:
        fast = describe(exc)
    if not isinstance(event, dict):  # the one difference: pydantic adds "or instance of RequestEvent"
        assert fast == ("events[1]", "events[1]: Input should be a valid dictionary")
        assert published[0] == "events[1]" and published[1].startswith(fast[1])
    else:
        assert fast == published


@pytest.mark.parametrize("event", [
    {"model": "alpha"}, {"model": "alpha", "count": 0}, {"model": "alpha", "count": 1_000_000, "ts": Ago(0)},
    {"model": "alpha", "ts": Ago(60, whole=True)}, {"model": "alpha", "ts": None}, {"model": "alpha", "count": 3},
    {"model": ""}, {"model": "a" * 129}, {"model": "-x"}, {"model": 7}, {"model": ["alpha"]}, {"model": {}},
    {"model": "alpha", "count": 1_000_001}, {"model": "alpha", "count": -1}, {"model": "alpha", "count": 2.0},
    {"model": "alpha", "count": False}, {"model": "alpha", "ts": True}, {"model": "alpha", "ts": 10**400},
    {"model": "alpha", "ts": float("nan")}, {"model": "alpha", "ts": float("inf")}, {"model": "alpha", "ts": "1"},
    {"model": "alpha", "ts": Ago(9 * 86400)}, {"model": "alpha", "ts": Ago(-3600)},
    {"model": "alpha", "extra": 1}, {"model": "nope"}, {"count": 1}, {"ts": 1.0}, {}, "alpha", None, 7, ["alpha"],
])
@pytest.mark.parametrize("shape", ["single", "batch"])
def test_the_fast_path_accepts_only_what_full_validation_accepts(event: object, shape: str, tmp_path: Path) -> None:
    # web.hook_events takes a body without pydantic when it is plainly valid, else hands it to the full
    # validation (which then names the field). It must never take what that would refuse, nor count
    # other than it would.
    from pydantic import ValidationError

    from prewarm.catalog import load_catalog
    from web import hook_events
    from web.schemas import REQUEST_BATCH, RequestEvent

    catalog = load_catalog(make_catalog(tmp_path / "models"))
    event = at_run(event)
    body = event if shape == "single" else {"events": [{"model": "beta", "count": 2}, event]}
    now = time.time()
    fast = hook_events.counts(body, catalog, now)
    try:
        if shape == "single":
            one = RequestEvent.model_validate(body)
            full = [(one.model, one.count, one.ts)]
        else:
            full = [(e["model"], e.get("count", 1), e.get("ts")) for e in REQUEST_BATCH.validate_python(body)["events"]]
        if any(m not in catalog for m, _, _ in full):
            full = None
    except ValidationError:
        full = None
    # Every valid shape a router sends is taken by the fast path; refusals are left to full validation.
    assert (fast is None) == (full is None), (body, fast, full)
    if fast is None:
        return
    expected: dict[float, dict[str, int]] = {}
    for m, n, ts in full:
        per = expected.setdefault(now if ts is None else ts, {})
        per[m] = per.get(m, 0) + n
    assert fast == (expected, len(full))


def test_a_catalog_change_is_seen_after_the_recheck_interval(redis_url: str, tmp_path: Path, r: redis.Redis,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from prewarm import context

    monkeypatch.setattr(context, "CATALOG_RECHECK_S", 3600.0)
    path = make_catalog(tmp_path / "models", {"alpha": 1})
    client = create_app(make_context(redis_url, path)).test_client()
    assert client.post("/hooks/requests", json={"model": "alpha"}).status_code == 202
    make_catalog(tmp_path / "models", {"alpha": 1, "delta": 1})
    os.utime(path, (time.time() + 5, time.time() + 5))  # a new mtime even on a coarse-grained filesystem
    # Within the interval the file is not looked at again (no stat per request) ...
    assert client.post("/hooks/requests", json={"model": "delta"}).status_code == 422
    monkeypatch.setattr(context, "CATALOG_RECHECK_S", 0.0)
    # ... after it, the new entry is served.
    assert client.post("/hooks/requests", json={"model": "delta"}).status_code == 202
    assert traffic.totals(r) == {"alpha": 1, "delta": 1}


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_weights_file_is_its_entrys_problem_and_the_hooks_serve_the_others(
        redis_url: str, tmp_path: Path, r: redis.Redis, kind: str) -> None:
    # Before: the header's RecursionError / ValueError escaped the catalog load, and every hook answered 500.
    path = make_catalog(tmp_path / "models", {"alpha": 1})
    evil = tmp_path / "models" / "evil-v1.safetensors"
    write_hostile_header(evil, kind)
    path.write_text(path.read_text() + '[[models]]\nid = "evil"\nversion = "v1"\nweights = "evil-v1.safetensors"\n'
                    'builder = "json:loads"\n[[models.warmup]]\nshape = [1, 4]\n')
    client = create_app(make_context(redis_url, path)).test_client()
    assert client.post("/hooks/requests", json={"model": "alpha"}).status_code == 202
    assert client.get("/hooks/route?model=alpha").status_code == 200
    refused = client.post("/hooks/requests", json={"model": "evil"})
    assert refused.status_code == 422 and refused.get_json()["field"] == "model"
    problem = client.get("/api/models").get_json()["catalog_problems"]["evil"]
    assert problem.startswith(f"model 'evil': weights: {evil}: header: ")
    assert traffic.totals(r) == {"alpha": 1}


def _open_fifo_writer(path: Path) -> int:
    """The write end of the FIFO at `path`, once a reader has it open (O_NONBLOCK: ENXIO until then)."""
    def attempt() -> int | None:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return None
    fd = wait_for(lambda: (fd := attempt()) is not None and fd + 1, 60, what="the reload to open the catalog") - 1
    os.set_blocking(fd, True)
    return fd


def test_one_catalog_reload_at_a_time_and_the_other_threads_are_served_the_old_catalog(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: every request thread that saw the file change started its own reload (a slow catalog piled up
    # gigabytes in one web worker and hung requests). The reload here reads a FIFO: it lasts exactly until
    # the test writes the new catalog into it.
    from prewarm import context

    monkeypatch.setattr(context, "CATALOG_RECHECK_S", 0.0)  # every call looks at the file
    path = make_catalog(tmp_path / "models", {"alpha": 1})
    ctx = make_context(redis_url, path)
    old = ctx.catalog
    new_text = make_catalog(tmp_path / "models", {"alpha": 1, "delta": 1}).read_text()
    path.unlink()
    os.mkfifo(path)
    os.utime(path, (time.time() + 5, time.time() + 5))  # a new mtime even on a coarse-grained filesystem

    got: dict[str, list[Catalog]] = {"reloader": [], "others": []}
    reloader = threading.Thread(target=lambda: got["reloader"].append(ctx.catalog))
    reloader.start()
    fd = _open_fifo_writer(path)  # the reloader is now inside its reload, blocked reading the FIFO
    others = [threading.Thread(target=lambda: got["others"].append(ctx.catalog)) for _ in range(8)]
    try:
        for t in others:
            t.start()
        guard = time.monotonic() + 60  # against a hang (a second reload blocks on the FIFO too), not a timing
        for t in others:
            t.join(timeout=max(0.0, guard - time.monotonic()))
        assert len(got["others"]) == len(others), "a thread waited for the reload (or started its own)"
        assert all(c is old for c in got["others"])
        assert got["reloader"] == []  # still reloading: the others did not wait for it
    finally:
        os.write(fd, new_text.encode())
        os.close(fd)
        reloader.join(timeout=60)
        for t in others:
            t.join(timeout=60)
    assert not reloader.is_alive() and len(got["reloader"]) == 1
    new = got["reloader"][0]
    assert new is not old and new.ids() == ["alpha", "delta"]
    monkeypatch.setattr(context, "CATALOG_RECHECK_S", 3600.0)  # (writing the FIFO changed its mtime again)
    assert ctx.catalog is new


def test_unknown_ids_leave_no_trace_and_known_ones_only_expiring_buckets(client: FlaskClient,
                                                                          r: redis.Redis) -> None:
    # The store must not grow with the number of distinct ids a router sends: unknown ones write nothing.
    for i in range(50):
        resp = client.post("/hooks/requests", json={"events": [{"model": f"stray-{i}-{j}"} for j in range(20)]})
        assert resp.status_code == 422 and resp.get_json()["field"] == "events[0].model"
    assert r.dbsize() == 0
    assert client.post("/hooks/requests", json={"events": [{"model": "alpha"}, {"model": "beta", "count": 2}]}
                       ).status_code == 202
    # Known ids: every bucket expires by itself; only the two per-model records (bounded by the catalog) stay.
    stored = {k.decode(): r.ttl(k) for k in r.scan_iter(match=keys.PREFIX + "*")}
    lasting = sorted(k for k, ttl in stored.items() if ttl < 0)
    assert lasting == sorted([keys.LAST_REQUEST, keys.REQUESTS_TOTAL]), stored
    assert all(0 < ttl <= traffic.MINUTE_TTL_S + 60 for k, ttl in stored.items() if k not in lasting)
    assert set(r.hkeys(keys.REQUESTS_TOTAL)) == {b"alpha", b"beta"}
