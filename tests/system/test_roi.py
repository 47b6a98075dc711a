"""What warmth costs and buys (issue 14 item 5): GET /api/roi?window=SECONDS and the console's ROI page,
from the route hook's per-minute counts, the dispatcher's note of why each replica was loaded, and the
leader scheduler's memory-time accounting. Real Redis; the last test runs a real worker, web and
scheduler."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
import requests
from flask.testing import FlaskClient

from prewarm import keys, state
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.store import memory_time
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.scheduler_procs import SchedulerProc
from tests.web_support import MIB, WebProc, make_catalog, make_context, publish_gpu, queued_tasks, replica
from web.app import create_app

GPU = "node-a/cpu:0"
KEYS = {"id", "gpu_memory_gib_hours", "warm_hits", "cold_starts", "cold_starts_avoided", "cost"}


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return make_catalog(tmp_path / "models")


def _client(redis_url: str, catalog: Path, cost: str | None = None) -> FlaskClient:
    if cost is None:
        return create_app(make_context(redis_url, catalog)).test_client()
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_DATA_DIR": str(catalog.parent),
           "PREWARM_GPU_HOUR_COST": cost}
    return create_app(Context(Settings.from_env(env), start_redis=False)).test_client()


def test_roi_counts_warm_hits_cold_starts_and_those_avoided(redis_url: str, catalog: Path, r: redis.Redis) -> None:
    client = _client(redis_url, catalog)
    g = publish_gpu(r, GPU, total_mib=64)
    ctx = make_context(redis_url, catalog)
    # alpha loaded speculatively (ahead of any request) by the scheduler, gamma on demand by the router
    assert ctx.dispatcher.preload("alpha", "v1", g, actor="scheduler", reason="forecast", kind="speculative").sent
    assert ctx.dispatcher.preload("gamma", "v1", g, actor="router", reason="cold", kind="demand").sent
    publish_gpu(r, GPU, total_mib=64, replicas=[replica("alpha", GPU, "ready"), replica("gamma", GPU, "ready", mib=4)])
    for _ in range(3):
        assert client.get("/hooks/route?model=alpha").get_json()["state"] == "ready"
    client.get("/hooks/route?model=alpha&retry=1")  # a poll is no request
    client.get("/hooks/route?model=gamma")
    client.get("/hooks/route?model=beta")  # cold: an episode opens (its on-demand preload is queued)
    client.get("/hooks/route?model=beta&retry=1")
    body = client.get("/api/roi?window=600").get_json()
    assert set(body) >= {"window_seconds", "gpu_hour_cost", "models"} and body["window_seconds"] == 600
    rows = {m["id"]: m for m in body["models"]}
    assert all(set(m) == KEYS for m in body["models"]) and set(rows) == {"alpha", "beta", "gamma"}
    assert (rows["alpha"]["warm_hits"], rows["alpha"]["cold_starts_avoided"], rows["alpha"]["cold_starts"]) == (3, 3, 0)
    assert (rows["gamma"]["warm_hits"], rows["gamma"]["cold_starts_avoided"]) == (1, 0)  # loaded for a request
    assert (rows["beta"]["warm_hits"], rows["beta"]["cold_starts"]) == (0, 1)
    assert body["totals"]["warm_hits"] == 4


@pytest.mark.parametrize("kind", ["fill", "forecast"])
def test_a_fill_and_a_baselines_load_ahead_count_as_avoided(kind: str, redis_url: str, catalog: Path,
                                                             r: redis.Redis) -> None:
    # one list of loads ahead (prewarm.domain.action_kinds): live left out prewarm's fills and the baselines' loads
    # ahead (the forecast autoscaler's, run as PREWARM_POLICY), so their warm hits counted as nothing avoided
    client = _client(redis_url, catalog)
    g = publish_gpu(r, GPU, total_mib=64)
    ctx = make_context(redis_url, catalog)
    assert ctx.dispatcher.preload("alpha", "v1", g, actor="scheduler", reason="ahead", kind=kind).sent
    publish_gpu(r, GPU, total_mib=64, replicas=[replica("alpha", GPU, "ready")])
    for _ in range(2):
        assert client.get("/hooks/route?model=alpha").get_json()["state"] == "ready"
    rows = {m["id"]: m for m in client.get("/api/roi?window=600").get_json()["models"]}
    assert (rows["alpha"]["warm_hits"], rows["alpha"]["cold_starts_avoided"]) == (2, 2)


def test_a_retry_flag_in_any_case_is_a_poll_and_any_other_value_is_refused(redis_url: str, catalog: Path,
                                                                            r: redis.Redis) -> None:
    """`retry=True` (what a Python router's params={"retry": True} sends) is a poll, not another request; a value
    that is no flag is a 400 naming `retry`, before anything is counted or an episode opened."""
    client = _client(redis_url, catalog)
    g = publish_gpu(r, GPU, total_mib=64)
    publish_gpu(r, GPU, total_mib=64, replicas=[replica("alpha", GPU, "ready")])
    assert client.get("/hooks/route?model=alpha").get_json()["state"] == "ready"
    for flag in ("True", "TRUE", "yes", "1"):
        assert client.get(f"/hooks/route?model=alpha&retry={flag}").status_code == 200
    for bad in ("maybe", "2", "on-ish"):
        for model in ("alpha", "beta"):
            answer = client.get(f"/hooks/route?model={model}&retry={bad}")
            assert answer.status_code == 400, answer.get_json()
            assert answer.get_json()["field"] == "retry" and repr(bad) in answer.get_json()["error"]
    assert not r.hexists(keys.COLD_STARTS, "beta") and queued_tasks(r, g.queue) == []  # refused before anything
    for flag in ("0", "false", "No"):  # a request, counted
        assert client.get(f"/hooks/route?model=alpha&retry={flag}").status_code == 200
    rows = {m["id"]: m for m in client.get("/api/roi?window=600").get_json()["models"]}
    assert rows["alpha"]["warm_hits"] == 4  # the first lookup and the three flagged as requests, no poll


def test_roi_memory_time_and_its_cost(redis_url: str, catalog: Path, r: redis.Redis) -> None:
    now = time.time()
    fleet = state.Fleet([state.Gpu(GPU, "node-a", "cpu:0", "q", 64 * MIB, 16 * MIB, 48 * MIB, now,
                                   replicas=[replica("gamma", GPU, "ready", mib=16),
                                             replica("beta", GPU, "failed", mib=0)])])
    memory_time.account(r, fleet, None, now - 10)  # the first account only starts the clock
    memory_time.account(r, fleet, now - 10, now)  # 16 MiB for 10 s, a quarter of the GPU
    body = _client(redis_url, catalog, cost="3.6").get("/api/roi").get_json()
    assert body["window_seconds"] == 3600 and body["gpu_hour_cost"] == 3.6
    gamma = next(m for m in body["models"] if m["id"] == "gamma")
    assert gamma["gpu_memory_gib_hours"] == pytest.approx(16 / 1024 * 10 / 3600, rel=0.02)
    assert gamma["cost"] == pytest.approx(0.25 * 10 / 3600 * 3.6, rel=0.02)  # a quarter GPU for 10 s
    assert next(m for m in body["models"] if m["id"] == "beta")["gpu_memory_gib_hours"] == 0  # failed holds none
    assert body["models"][0]["id"] == "gamma"  # the most memory-time first


@pytest.mark.parametrize("window", ["abc", "59", "86401", "1.5"])
def test_a_bad_window_is_a_400_naming_it(redis_url: str, catalog: Path, window: str) -> None:
    resp = _client(redis_url, catalog).get(f"/api/roi?window={window}")
    assert resp.status_code == 400 and resp.get_json()["field"] == "window"
    assert "seconds" in resp.get_json()["error"]


def test_the_console_roi_page_lists_the_models(redis_url: str, catalog: Path, r: redis.Redis) -> None:
    client = _client(redis_url, catalog)
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "ready")])
    client.get("/hooks/route?model=alpha")
    html = client.get("/roi?window=900").get_data(as_text=True)
    assert 'data-model="alpha"' in html and "GiB·h" in html and "No GPU-hour price set" in html
    assert client.get("/roi?window=nope").status_code == 200  # a bad window falls back to an hour, flashed


@pytest.mark.slow
def test_roi_of_a_real_fleet(redis_url: str, r: redis.Redis, tmp_path: Path, worker_factory) -> None:  # noqa: F811
    """A real worker loads a model on a cold lookup; the real scheduler accounts its memory while it is
    held; warm lookups count; /api/roi on the real web reports them."""
    catalog = tiny_catalog(tmp_path / "models", ["tiny-mlp", "tiny-lm"])
    w = worker_factory(catalog, devices="cpu:0=256MiB")
    web = WebProc(redis_url, catalog, tmp_path, workers=1, env={"PREWARM_GPU_HOUR_COST": "2"})
    sched = SchedulerProc(redis_url, catalog, tmp_path)
    try:
        route = f"{web.url}/hooks/route"
        assert requests.get(route, params={"model": "tiny-mlp"}, timeout=10).json()["state"] == "cold"
        wait_for(lambda: requests.get(route, params={"model": "tiny-mlp", "retry": 1}, timeout=10).json()["state"]
                 == "ready", 60, what="tiny-mlp ready", log=w.log)
        for _ in range(4):
            requests.get(route, params={"model": "tiny-mlp"}, timeout=10)

        def reported() -> dict | None:
            body = requests.get(f"{web.url}/api/roi", params={"window": 300}, timeout=10).json()
            row = next(m for m in body["models"] if m["id"] == "tiny-mlp")
            return row if row["gpu_memory_gib_hours"] > 0 else None

        row = wait_for(reported, 60, what="memory-time accounted", log=sched.log)
        assert row["warm_hits"] == 4 and row["cold_starts"] == 1 and row["cold_starts_avoided"] == 0
        assert row["cost"] > 0
    finally:
        sched.stop()
        web.stop()
