"""Metrics: names and values, multiprocess mode under real gunicorn, and promtool on the exposition, the
alert rules (check + unit tests) and the dashboard's queries.

promtool comes with Debian's `prometheus` package (`apt-get install -y prometheus`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from prewarm import keys, state
from web import metrics
from web.app import create_app

from .web_support import MIB, WebProc, make_catalog, make_context, publish_gpu, replica

REPO = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not found: apt-get install -y prometheus")
REQUIRED = ("prewarm_requests_total", "prewarm_route_lookups_total", "prewarm_cold_starts_total",
            "prewarm_cold_start_duration_seconds", "prewarm_model_load_seconds", "prewarm_model_warmup_seconds",
            "prewarm_gpu_memory_bytes", "prewarm_preloads_total", "prewarm_evictions_total",
            "prewarm_scheduler_tick_seconds", "prewarm_stages_total", "prewarm_unstages_total",
            "prewarm_host_cache_bytes")
GPU = "node-a/cpu:0"


def _samples(text: str) -> dict[str, float]:
    """'name{labels}' -> value for every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _promtool_check_metrics(text: str) -> None:
    assert PROMTOOL
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), \
        f"promtool check metrics:\n{proc.stdout}{proc.stderr}"


@pytest.fixture
def client(redis_url: str, tmp_path: Path) -> FlaskClient:
    return create_app(make_context(redis_url, make_catalog(tmp_path / "models"))).test_client()


def test_exposition_has_every_metric_with_live_values(client: FlaskClient, r: redis.Redis) -> None:
    before = _samples(client.get("/metrics").get_data(as_text=True))
    publish_gpu(r, GPU, total_mib=10, replicas=[replica("alpha", GPU, "ready", mib=1),
                                                replica("beta", GPU, "loading", mib=2, progress=0.5)])
    r.sadd(keys.GPUS, "node-z/cpu:0")  # stale
    client.post("/hooks/requests", json={"events": [{"model": "alpha", "count": 5}, {"model": "gamma"}]})
    assert client.get("/hooks/route?model=alpha").get_json()["state"] == "ready"
    assert client.get("/hooks/route?model=beta").get_json()["state"] == "loading"
    assert client.get("/hooks/route?model=gamma").get_json()["state"] == "cold"  # + one on-demand preload
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.mimetype == "text/plain"
    text = resp.get_data(as_text=True)
    for name in REQUIRED:
        assert f"# TYPE {name} " in text, name
    s = _samples(text)
    assert s['prewarm_requests_total{model="alpha"}'] == 5 and s['prewarm_requests_total{model="gamma"}'] == 1
    for result in ("ready", "loading", "cold"):
        key = f'prewarm_route_lookups_total{{result="{result}"}}'
        assert s[key] - before.get(key, 0) == 1
    cold = 'prewarm_cold_starts_total{model="gamma"}'
    assert s[cold] - before.get(cold, 0) == 1
    assert s['prewarm_preloads_total{reason="demand"}'] == 1
    assert s[f'prewarm_gpu_memory_bytes{{gpu="{GPU}",kind="ready"}}'] == MIB
    assert s[f'prewarm_gpu_memory_bytes{{gpu="{GPU}",kind="loading"}}'] == 2 * MIB
    assert s[f'prewarm_gpu_memory_bytes{{gpu="{GPU}",kind="free"}}'] == 7 * MIB
    assert s['prewarm_gpu_up{gpu="node-z/cpu:0"}'] == 0 and s[f'prewarm_gpu_up{{gpu="{GPU}"}}'] == 1


def test_host_cache_and_stage_metrics(client: FlaskClient, r: redis.Redis) -> None:
    staged = [state.Staged(model="alpha", version="v1", node="node-a", state="staged", bytes=3 * MIB),
              state.Staged(model="beta", version="v1", node="node-a", state="staging", bytes=MIB,
                           total_bytes=2 * MIB)]
    # used counts what staging models have reserved (their whole size), not what they have read so far
    state.write_node(r, state.Node(node="node-a", budget_bytes=8 * MIB, used_bytes=5 * MIB, free_bytes=3 * MIB),
                     staged, ttl=30)
    r.hincrby(keys.DISPATCH_COUNTS, "stage:speculative", 2)
    r.hincrby(keys.DISPATCH_COUNTS, "unstage:operator", 1)
    text = client.get("/metrics").get_data(as_text=True)
    s = _samples(text)
    assert s['prewarm_host_cache_bytes{kind="staged",node="node-a"}'] == 3 * MIB
    assert s['prewarm_host_cache_bytes{kind="staging",node="node-a"}'] == 2 * MIB
    assert s['prewarm_host_cache_bytes{kind="free",node="node-a"}'] == 3 * MIB
    assert s['prewarm_stages_total{reason="speculative"}'] == 2
    assert s['prewarm_unstages_total{reason="operator"}'] == 1
    assert 'prewarm_preloads_total{reason="speculative"}' not in s


def test_cold_start_and_load_times_are_observed_once(client: FlaskClient, r: redis.Redis) -> None:
    def count(name: str) -> float:
        return _samples(client.get("/metrics").get_data(as_text=True)).get(name, 0.0)

    cold0, load0 = count("prewarm_cold_start_duration_seconds_count"), count("prewarm_model_load_seconds_count")
    publish_gpu(r, GPU)
    client.get("/hooks/route?model=alpha")
    seen = json.loads(r.hget(keys.COLD_STARTS, "alpha"))["seen_at"]
    rep = replica("alpha", GPU, "ready", since=seen + 3.0)
    rep.load_seconds, rep.warmup_seconds = 2.5, 0.5
    publish_gpu(r, GPU, replicas=[rep])
    for _ in range(3):  # repeated scrapes and lookups observe each cold start and load once
        client.get("/hooks/route?model=alpha")
        assert count("prewarm_cold_start_duration_seconds_count") == cold0 + 1
        assert count("prewarm_model_load_seconds_count") == load0 + 1
    # A reload of the same model on the same GPU is a new load.
    rep2 = replica("alpha", GPU, "ready")
    rep2.created_at += 100
    rep2.load_seconds, rep2.warmup_seconds = 1.0, 0.1
    publish_gpu(r, GPU, replicas=[rep2])
    assert count("prewarm_model_load_seconds_count") == load0 + 2
    assert count("prewarm_model_warmup_seconds_count") >= 2


@needs_promtool
def test_promtool_accepts_the_exposition(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "ready")])
    client.post("/hooks/requests", json={"model": "alpha", "count": 2})
    client.get("/hooks/route?model=beta")
    _promtool_check_metrics(client.get("/metrics").get_data(as_text=True))


@needs_promtool
def test_promtool_checks_and_unit_tests_the_alert_rules() -> None:
    rules = REPO / "deploy" / "prometheus"
    proc = subprocess.run([PROMTOOL, "check", "rules", str(rules / "alerts.yml")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=rules, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_dashboard_and_rules_only_use_exported_metrics() -> None:
    dash = json.loads((REPO / "deploy" / "grafana" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs.append((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())
    known = {m.removesuffix("_total") for m in REQUIRED} | {"prewarm_gpu_up"}
    used = {n for e in exprs for n in re.findall(r"\bprewarm_[a-z_]+", e)}
    for name in used:
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert base in known, f"{name} is not a metric prewarm exports"
    assert {"prewarm_route_lookups_total", "prewarm_cold_start_duration_seconds_bucket",
            "prewarm_gpu_memory_bytes"} <= used


def test_metric_docs_list_every_metric() -> None:
    doc = (REPO / "docs" / "metrics.md").read_text()
    for name in REQUIRED:
        assert f"`{name}`" in doc, name


# --- under gunicorn: several worker processes, multiprocess mode -------------------------------------
def test_multiprocess_metrics_under_gunicorn(redis_url: str, tmp_path: Path, r: redis.Redis) -> None:
    web = WebProc(redis_url, make_catalog(tmp_path / "models"), tmp_path, workers=3)
    try:
        publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "ready")])
        lookups = 60
        for _ in range(lookups):  # a new connection each time: spread over the gunicorn workers
            status, body = web.get("/hooks/route?model=alpha")
            assert status == 200 and json.loads(body)["state"] == "ready"
        status, body = web.get("/metrics")
        assert status == 200
        text = body.decode()
        assert _samples(text)['prewarm_route_lookups_total{result="ready"}'] == lookups  # summed over workers
        for name in REQUIRED:
            assert f"# TYPE {name} " in text, name
        assert len([f for f in os.listdir(web.multiproc_dir) if f.startswith("counter_")]) >= 2
        if PROMTOOL:
            _promtool_check_metrics(text)
    finally:
        web.stop()


def test_metric_objects_are_importable_without_flask() -> None:
    import sys

    code = "import sys, web.metrics; assert 'flask' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)
    assert metrics.SCHEDULER_TICK is not None


def test_retry_lookups_are_not_counted_twice(client: FlaskClient, r: redis.Redis) -> None:
    def lookups() -> dict[str, float]:
        s = _samples(client.get("/metrics").get_data(as_text=True))
        return {k: s[f'prewarm_route_lookups_total{{result="{k}"}}'] for k in ("ready", "loading", "cold")}

    publish_gpu(r, GPU)
    before = lookups()
    assert client.get("/hooks/route?model=alpha").get_json()["state"] == "cold"
    for _ in range(3):  # the router waits for the preload, re-asking
        assert client.get("/hooks/route?model=alpha&retry=1").get_json()["state"] == "loading"
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "ready")])
    assert client.get("/hooks/route?model=alpha&retry=1").get_json()["state"] == "ready"
    after = lookups()
    assert {k: after[k] - before[k] for k in after} == {"ready": 0, "loading": 0, "cold": 1}
