"""The cold path as a router meets it (issue 14 items 1 and 2): a loading or cold route answer carries
`eta_seconds` and `Retry-After` from measured load times, progress and the GPU's load queue; the ETA given
is recorded and closed by the replica turning ready (prewarm_route_eta_error_seconds); a model's catalog
fallback is offered with its ready replicas, and counted.

Against a real Redis with the fleet published as the worker's heartbeats; the last test runs a real
worker and a real web process.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import redis
import requests
from flask.testing import FlaskClient

from prewarm import keys, state
from prewarm.catalog import load_catalog
from prewarm.catalog_entries import CatalogError
from prewarm.store import eta_promises, load_times
from prewarm.store.ready import replica_ready
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.web_support import WebProc, make_catalog, make_context, publish_gpu, replica
from web.app import create_app

GPU = "node-a/cpu:0"


def _with_fallback(path: Path, model: str, fallback: str) -> Path:
    text = path.read_text().replace(f'id = "{model}"\n', f'id = "{model}"\nfallback = "{fallback}"\n')
    path.write_text(text)
    return path


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return _with_fallback(make_catalog(tmp_path / "models"), "alpha", "beta")


@pytest.fixture
def client(redis_url: str, catalog: Path) -> FlaskClient:
    return create_app(make_context(redis_url, catalog)).test_client()


def _measured(r: redis.Redis, model: str, seconds: float) -> None:
    """The worker's record of one load of `model` that took `seconds` (load + warmup)."""
    pipe = r.pipeline()
    load_times.push(pipe, state.Replica(model, "v1", GPU, "ready", load_seconds=seconds, warmup_seconds=0.0))
    pipe.execute()


# --- ETA -------------------------------------------------------------------------------------------
def test_a_loading_answer_carries_an_eta_at_the_loads_own_pace(client: FlaskClient, r: redis.Redis) -> None:
    now = time.time()
    rep = replica("gamma", GPU, "loading", mib=4, progress=0.25, since=now - 3.0)
    publish_gpu(r, GPU, replicas=[rep])
    resp = client.get("/hooks/route?model=gamma")
    body = resp.get_json()
    assert body["state"] == "loading"
    # a quarter in 3 s: three quarters left at that pace, about 9 s (plus a warmup of a few ms)
    assert 8.5 <= body["eta_seconds"] <= 9.5, body
    assert resp.headers["Retry-After"] == str(math.ceil(body["eta_seconds"]))
    assert "fallback" not in body  # gamma names none


def test_a_queued_load_waits_for_a_slot_of_its_gpu(client: FlaskClient, r: redis.Redis) -> None:
    """Two loads hold the GPU's two slots (PREWARM_MAX_LOADS_PER_GPU=2); the one queued behind them starts
    when the sooner finishes: its ETA is that plus its own measured load time."""
    _measured(r, "alpha", 5.0)
    _measured(r, "beta", 10.0)
    _measured(r, "gamma", 20.0)
    now = time.time()
    publish_gpu(r, GPU, total_mib=64, replicas=[replica("beta", GPU, "loading", mib=2, progress=0.0, since=now),
                                                replica("gamma", GPU, "loading", mib=4, progress=0.0, since=now),
                                                replica("alpha", GPU, "pending", mib=0, progress=0.0, since=now)])
    body = client.get("/hooks/route?model=alpha").get_json()
    assert body["state"] == "loading"
    assert 14.0 <= body["eta_seconds"] <= 15.5, body  # beta's 10 s, then alpha's 5 s
    # the same model alone on a GPU with a free slot: its own load time
    r.delete(keys.gpu(GPU), keys.replicas(GPU))
    r.srem(keys.GPUS, GPU)
    r.delete(keys.ETA_PROMISES)
    publish_gpu(r, "node-b/cpu:0", replicas=[replica("alpha", "node-b/cpu:0", "pending", mib=0, progress=0.0)])
    body = client.get("/hooks/route?model=alpha").get_json()
    assert 4.5 <= body["eta_seconds"] <= 5.5, body


def test_a_cold_answer_promises_the_on_demand_load_it_queued(client: FlaskClient, r: redis.Redis) -> None:
    _measured(r, "gamma", 7.0)
    publish_gpu(r, GPU)
    resp = client.get("/hooks/route?model=gamma")
    body = resp.get_json()
    assert body["state"] == "cold" and body["preload"]["queued"] is True
    assert 6.5 <= body["eta_seconds"] <= 7.5, body
    assert resp.headers["Retry-After"] in ("7", "8")
    # a cold model with no room: its load time and a tick for the scheduler to make room, still an ETA
    r.delete(keys.ETA_PROMISES)
    publish_gpu(r, "node-a/cpu:0", total_mib=3)  # beta (2 MiB) fits nowhere with gamma's 4 MiB promised
    body = client.get("/hooks/route?model=beta").get_json()
    assert body["state"] == "cold" and body["eta_seconds"] > 0 and "Retry-After" in client.get(
        "/hooks/route?model=beta&retry=1").headers


def test_a_ready_answer_has_no_eta(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, replicas=[replica("gamma", GPU, "ready", mib=4)])
    resp = client.get("/hooks/route?model=gamma")
    assert resp.get_json()["state"] == "ready" and "eta_seconds" not in resp.get_json()
    assert "Retry-After" not in resp.headers and not r.exists(keys.ETA_PROMISES)


def test_the_first_eta_given_is_closed_by_the_replica_turning_ready(client: FlaskClient, r: redis.Redis) -> None:
    _measured(r, "gamma", 7.0)
    publish_gpu(r, GPU)
    first = client.get("/hooks/route?model=gamma").get_json()["eta_seconds"]
    promised = eta_promises.read(r)["gamma@v1"]
    for _ in range(3):  # the router polling: the promise it first acted on stays
        client.get("/hooks/route?model=gamma&retry=1")
    assert eta_promises.read(r)["gamma@v1"] == promised
    ready = replica("gamma", GPU, "ready", mib=4, since=promised.at + 10.0)
    ready.load_seconds, ready.warmup_seconds = 9.5, 0.5
    replica_ready(r, ready)
    assert not r.hexists(keys.ETA_PROMISES, "gamma@v1")
    # real 10 s − promised 7 s = 3 s late: in the (2, 5] bucket. (A histogram with negative bounds has no
    # _count/_sum in the exposition, by the OpenMetrics rule: the +Inf bucket is the count.)
    assert first == pytest.approx(7.0, abs=0.01)
    buckets = _eta_buckets(client)
    assert (buckets["2.0"], buckets["5.0"], buckets["+Inf"]) == (0, 1, 1), buckets
    assert float(r.hget(keys.histogram("prewarm_route_eta_error_seconds"), "sum")) == pytest.approx(3.0, abs=0.01)
    # a speculative load nobody was promised observes nothing
    replica_ready(r, replica("beta", GPU, "ready", mib=2))
    assert _eta_buckets(client)["+Inf"] == 1
    # /api/eta keeps the closed promise itself, so its quantiles are exact, not bucket bounds
    rep = client.get("/api/eta").get_json()
    assert rep["count"] == 1 and rep["error_seconds"]["median"] == pytest.approx(3.0, abs=0.01)
    assert [(x["model"], x["promised"], x["real"]) for x in rep["recent"]] == [("gamma", pytest.approx(7.0, abs=0.01),
                                                                                  pytest.approx(10.0, abs=0.01))]
    assert client.get("/api/eta?limit=x").status_code == 400


def test_api_eta_gives_the_exact_median_and_p95_of_the_kept_errors(client: FlaskClient, r: redis.Redis) -> None:
    """Errors 0..19 s (real 10 + e against a 10 s promise): median 9.5, p95 by linear interpolation
    18.05; the report lists the newest first and keeps at most KEPT."""
    for e in range(20):
        with r.pipeline() as pipe:
            pipe.multi()
            eta_promises.queue_close(pipe, f"m{e}", "v1", 100.0 + 10.0 + e, eta_promises.Promise(100.0, 10.0))
            pipe.execute()
    rep = client.get("/api/eta?limit=3").get_json()
    assert rep["count"] == 20
    assert rep["error_seconds"]["median"] == pytest.approx(9.5)
    assert rep["error_seconds"]["p95"] == pytest.approx(18.05)
    assert [x["model"] for x in rep["recent"]] == ["m19", "m18", "m17"]
    assert r.llen(keys.ETA_ERRORS) == 20 <= eta_promises.KEPT


def _eta_buckets(client: FlaskClient) -> dict[str, float]:
    out = {}
    for ln in client.get("/metrics").get_data(as_text=True).splitlines():
        if ln.startswith("prewarm_route_eta_error_seconds_bucket{"):
            out[ln.split('le="')[1].split('"')[0]] = float(ln.rpartition(" ")[2])
    return out


# --- fallback --------------------------------------------------------------------------------------
def test_a_cold_model_is_offered_its_fallbacks_ready_replicas(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, total_mib=3, replicas=[replica("beta", GPU, "ready", mib=2)])
    body = client.get("/hooks/route?model=alpha").get_json()
    assert body["state"] == "cold" and body["replicas"] == []
    assert body["fallback"]["model"] == "beta" and body["fallback"]["version"] == "v1"
    assert [(x["gpu"], x["state"]) for x in body["fallback"]["replicas"]] == [(GPU, "ready")]
    assert "eta_seconds" in body
    before = _fallbacks(client)
    client.get("/hooks/route?model=alpha")
    client.get("/hooks/route?model=alpha&retry=1")  # a poll: offered again, not counted again
    assert _fallbacks(client) == before + 1


def test_a_fallback_with_nothing_ready_is_named_with_no_replicas(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU)
    body = client.get("/hooks/route?model=alpha").get_json()
    before = _fallbacks(client)
    assert body["fallback"] == {"model": "beta", "version": "v1", "replicas": []}
    client.get("/hooks/route?model=alpha")
    assert _fallbacks(client) == before  # nothing to serve from: not an offer


def _fallbacks(client: FlaskClient) -> float:
    """prewarm_route_fallbacks_total{model="alpha",fallback="beta"} (this process's counter)."""
    for ln in client.get("/metrics").get_data(as_text=True).splitlines():
        if ln.startswith('prewarm_route_fallbacks_total{fallback="beta",model="alpha"}'):
            return float(ln.rpartition(" ")[2])
    return 0.0


def test_a_ready_model_gets_no_fallback(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "ready"), replica("beta", GPU, "ready", mib=2)])
    assert "fallback" not in client.get("/hooks/route?model=alpha").get_json()


@pytest.mark.parametrize("value, message, kept", [
    ('"nope"', "model 'alpha': fallback 'nope' is not a model", True),
    ('"alpha"', "model 'alpha': fallback 'alpha' is the model itself", True),
    ("3", "model 'alpha': fallback 3 must be the id", False),  # a malformed field: the entry is left out
])
def test_a_bad_fallback_is_refused_naming_the_entry(tmp_path: Path, value: str, message: str, kept: bool) -> None:
    path = _with_fallback(make_catalog(tmp_path / "models"), "alpha", "X")
    path.write_text(path.read_text().replace('fallback = "X"', f"fallback = {value}"))
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)
    lenient = load_catalog(path, strict=False)  # named; kept without the bad link when only the link is bad
    assert message in lenient.problems["alpha"] and ("alpha" in lenient) is kept and "beta" in lenient
    if kept:
        assert lenient.get("alpha").fallback is None


def test_a_cycle_of_fallbacks_is_refused_naming_it(tmp_path: Path) -> None:
    path = make_catalog(tmp_path / "models")
    for model, fb in (("alpha", "beta"), ("beta", "gamma"), ("gamma", "alpha")):
        _with_fallback(path, model, fb)
    with pytest.raises(CatalogError, match=r"model 'alpha': fallback 'beta' leads back to 'alpha' "
                                           r"\(alpha -> beta -> gamma -> alpha\)"):
        load_catalog(path)
    lenient = load_catalog(path, strict=False)  # one link dropped breaks the cycle; the others stay
    assert lenient.ids() == ["alpha", "beta", "gamma"] and list(lenient.problems) == ["alpha"]
    assert [lenient.get(m).fallback for m in ("alpha", "beta", "gamma")] == [None, "gamma", "alpha"]


def test_the_demo_catalog_declares_a_fallback() -> None:
    from gpu_worker.demo_models import FULL

    assert any(m.extra.get("fallback") for m in FULL)


# --- real processes ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_cold_lookup_answers_with_an_eta_and_the_fallbacks_ready_replica(
        redis_url: str, r: redis.Redis, tmp_path: Path, worker_factory) -> None:  # noqa: F811
    catalog = _with_fallback(tiny_catalog(tmp_path / "models", ["tiny-lm", "tiny-mlp"]), "tiny-lm", "tiny-mlp")
    w = worker_factory(catalog, devices="cpu:0=256MiB")
    web = WebProc(redis_url, catalog, tmp_path, workers=1)
    try:
        route = f"{web.url}/hooks/route"
        requests.get(route, params={"model": "tiny-mlp"}, timeout=10)  # the fallback, made ready first
        wait_for(lambda: any(x.state == "ready" for x in state.read_fleet(r).replicas("tiny-mlp")), 60,
                 what="tiny-mlp ready", log=w.log)
        resp = requests.get(route, params={"model": "tiny-lm"}, timeout=10)
        body = resp.json()
        assert body["state"] == "cold" and body["preload"]["queued"] is True, body
        assert body["eta_seconds"] > 0 and int(resp.headers["Retry-After"]) >= 1
        assert body["fallback"]["model"] == "tiny-mlp"
        assert [x["state"] for x in body["fallback"]["replicas"]] == ["ready"]
        wait_for(lambda: requests.get(route, params={"model": "tiny-lm", "retry": 1}, timeout=10).json()["state"]
                 == "ready", 60, what="tiny-lm ready", log=w.log)
        metrics = web.get("/metrics")[1].decode()
        # the worker closed the promise given for tiny-lm (and for tiny-mlp's own cold lookup)
        assert 'prewarm_route_eta_error_seconds_bucket{le="+Inf"} 2.0' in metrics, metrics
        assert 'prewarm_route_fallbacks_total{fallback="tiny-mlp",model="tiny-lm"} 1.0' in metrics
    finally:
        web.stop()
