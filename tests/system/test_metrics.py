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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from prewarm import keys, state
from prewarm.store import cold_starts, dispatch_counts
from prewarm.store.ready import replica_ready
from tests.web_support import MIB, WebProc, make_catalog, make_context, publish_gpu, replica
from web.app import create_app

REPO = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not found: apt-get install -y prometheus")
REQUIRED = ("prewarm_requests_total", "prewarm_route_lookups_total", "prewarm_cold_starts_total",
            "prewarm_cold_start_duration_seconds", "prewarm_model_load_seconds", "prewarm_model_warmup_seconds",
            "prewarm_gpu_memory_bytes", "prewarm_preloads_total", "prewarm_evictions_total",
            "prewarm_scheduler_tick_seconds", "prewarm_stages_total", "prewarm_unstages_total",
            "prewarm_host_cache_bytes", "prewarm_scheduler_tick_part_seconds", "prewarm_scheduler_redis_round_trips",
            "prewarm_scheduler_plan_actions", "prewarm_scheduler_plan_failures_total")
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
    # links shared: gamma's on-demand preload goes to the GPU loading beta (with the link wait no scheduler here would
    # place it)
    return create_app(make_context(redis_url, make_catalog(tmp_path / "models"), link_wait=False)).test_client()


def test_exposition_has_every_metric_with_live_values(client: FlaskClient, r: redis.Redis) -> None:
    before = _samples(client.get("/metrics").get_data(as_text=True))
    publish_gpu(r, GPU, total_mib=10, replicas=[replica("alpha", GPU, "ready", mib=1),
                                                replica("beta", GPU, "loading", mib=2, progress=0.5),
                                                replica("delta", GPU, "evicting", mib=3)])
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
    assert s[f'prewarm_gpu_memory_bytes{{gpu="{GPU}",kind="loading"}}'] == 2 * MIB  # on its way in only
    assert s[f'prewarm_gpu_memory_bytes{{gpu="{GPU}",kind="evicting"}}'] == 3 * MIB
    assert s[f'prewarm_gpu_memory_bytes{{gpu="{GPU}",kind="free"}}'] == 4 * MIB
    assert s['prewarm_gpu_up{gpu="node-z/cpu:0"}'] == 0 and s[f'prewarm_gpu_up{{gpu="{GPU}"}}'] == 1


def test_host_cache_and_stage_metrics(client: FlaskClient, r: redis.Redis) -> None:
    staged = [state.Staged(model="alpha", version="v1", node="node-a", state="staged", bytes=3 * MIB),
              state.Staged(model="beta", version="v1", node="node-a", state="staging", bytes=MIB,
                           total_bytes=2 * MIB)]
    # used counts what staging models have reserved (their whole size), not what they have read so far
    state.write_node(r, state.Node(node="node-a", budget_bytes=8 * MIB, used_bytes=5 * MIB, free_bytes=3 * MIB),
                     staged, ttl=30)
    for action, kind in (("stage", "speculative"), ("stage", "speculative"), ("unstage", "operator")):
        dispatch_counts.count(r, action, kind)
    text = client.get("/metrics").get_data(as_text=True)
    s = _samples(text)
    assert s['prewarm_host_cache_bytes{kind="staged",node="node-a"}'] == 3 * MIB
    assert s['prewarm_host_cache_bytes{kind="staging",node="node-a"}'] == 2 * MIB
    assert s['prewarm_host_cache_bytes{kind="free",node="node-a"}'] == 3 * MIB
    assert s['prewarm_stages_total{reason="speculative"}'] == 2
    assert s['prewarm_unstages_total{reason="operator"}'] == 1
    assert 'prewarm_preloads_total{reason="speculative"}' not in s


def _ready(since: float, load: float, warmup: float) -> state.Replica:
    rep = replica("alpha", GPU, "ready", since=since)
    rep.load_seconds, rep.warmup_seconds = load, warmup
    return rep


def test_cold_start_and_load_times_are_observed_once(client: FlaskClient, r: redis.Redis) -> None:
    def counts() -> tuple[float, float, float]:
        s = _samples(client.get("/metrics").get_data(as_text=True))
        return tuple(s[f"{n}_count"] for n in ("prewarm_cold_start_duration_seconds", "prewarm_model_load_seconds",
                                                 "prewarm_model_warmup_seconds"))  # type: ignore[return-value]

    assert counts() == (0, 0, 0)  # exported (zeros) before any event
    publish_gpu(r, GPU)
    client.get("/hooks/route?model=alpha")
    seen = json.loads(r.hget(keys.COLD_STARTS, "alpha"))["seen_at"]
    rep = _ready(seen + 3.0, 2.5, 0.5)
    publish_gpu(r, GPU, replicas=[rep])
    replica_ready(r, rep)  # what the worker does when the replica turns ready
    for _ in range(3):  # repeated scrapes and lookups (which may close it too) count each event once
        client.get("/hooks/route?model=alpha")
        assert counts() == (1, 1, 1)
    s = _samples(client.get("/metrics").get_data(as_text=True))
    assert s['prewarm_cold_start_duration_seconds_bucket{le="2.5"}'] == 0
    assert s['prewarm_cold_start_duration_seconds_bucket{le="5.0"}'] == 1
    assert s["prewarm_cold_start_duration_seconds_sum"] == pytest.approx(3.0, abs=0.01)
    assert s["prewarm_model_load_seconds_sum"] == 2.5
    # A reload of the same model on the same GPU is a new load, and no new cold start.
    replica_ready(r, _ready(time.time(), 1.0, 0.1))
    assert counts() == (1, 2, 2)


def test_a_cold_start_a_route_lookup_closes_first_is_counted_once(client: FlaskClient, r: redis.Redis) -> None:
    publish_gpu(r, GPU)
    client.get("/hooks/route?model=alpha")
    seen = json.loads(r.hget(keys.COLD_STARTS, "alpha"))["seen_at"]
    rep = _ready(seen + 2.0, 1.5, 0.5)
    publish_gpu(r, GPU, replicas=[rep])
    assert client.get("/hooks/route?model=alpha").get_json()["state"] == "ready"  # noticed before the worker
    replica_ready(r, rep)
    s = _samples(client.get("/metrics").get_data(as_text=True))
    assert s["prewarm_cold_start_duration_seconds_count"] == 1 and s["prewarm_model_load_seconds_count"] == 1
    assert s["prewarm_cold_start_duration_seconds_sum"] == pytest.approx(2.0, abs=0.01)


def _monitor(url: str, until: bytes, out: list[str], started: threading.Event) -> None:
    """Collect MONITOR lines until one carries `until` (a marker command the test sends afterwards)."""
    conn = redis.Redis.from_url(url)
    with conn.monitor() as m:
        started.set()
        for cmd in m.listen():
            if until.decode() in cmd["command"]:
                break
            out.append(cmd["command"])
    conn.close()


def test_a_scrape_sends_no_write_to_redis(redis_url: str, tmp_path: Path, r: redis.Redis) -> None:
    """Against the real web process: a /metrics scrape at a moment the old scrape wrote (an open cold start
    whose model has a ready replica, a load nobody observed) sends Redis only read commands; two scrapes
    show each event once, as recorded where it happened."""
    web = WebProc(redis_url, make_catalog(tmp_path / "models"), tmp_path, workers=1)
    try:
        seen = time.time() - 5
        cold_starts.open_episode(r, "alpha", "v1", seen)
        rep = _ready(seen + 4.0, 2.0, 0.5)
        publish_gpu(r, GPU, replicas=[rep])
        r.hincrby(keys.DISPATCH_COUNTS, "preload:demand", 1)
        seen_cmds: list[str] = []
        started = threading.Event()
        mon = threading.Thread(target=_monitor, args=(redis_url, b"end-of-scrapes", seen_cmds, started), daemon=True)
        mon.start()
        assert started.wait(10)
        r.echo("start-of-scrapes")  # MONITOR is live once this shows up in it
        scrapes = [web.get("/metrics") for _ in range(2)]
        r.echo("end-of-scrapes")
        mon.join(30)
        assert not mon.is_alive()
        assert all(status == 200 for status, _ in scrapes)
        names = {c.split()[0].upper() for c in seen_cmds if c.split()}
        assert "HGETALL" in names, seen_cmds  # the scrapes' reads were seen
        flags = {name.upper(): set(d["flags"]) for name, d in r.command().items()}
        writes = sorted(n for n in names if {"write", "may_replicate"} & flags.get(n, {"unknown"}))
        assert writes == [], seen_cmds
        first, second = (_samples(body.decode()) for _, body in scrapes)
        for name in ("prewarm_cold_start_duration_seconds_count", "prewarm_model_load_seconds_count"):
            assert first[name] == second[name] == 0  # nothing recorded it: the scrape does not either
        replica_ready(r, rep)  # the worker's record of that ready replica, with nobody scraping
        for _ in range(2):
            s = _samples(web.get("/metrics")[1].decode())
            assert s["prewarm_cold_start_duration_seconds_count"] == 1
            assert s["prewarm_model_load_seconds_count"] == 1 and s["prewarm_model_warmup_seconds_count"] == 1
    finally:
        web.stop()



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
        def lookup(_: int) -> tuple[int, bytes]:
            return web.get("/hooks/route?model=alpha")

        def counter_files() -> int:
            return len([f for f in os.listdir(web.multiproc_dir) if f.startswith("counter_")])

        # Until at least two worker processes have counted (gunicorn decides who accepts: threaded workers
        # may take a whole round between them), in rounds of 60 lookups from eight clients at once.
        lookups = 0
        with ThreadPoolExecutor(8) as pool:
            while lookups < 1200 and (lookups == 0 or counter_files() < 2):
                answers = list(pool.map(lookup, range(60)))
                assert all(status == 200 and json.loads(body)["state"] == "ready" for status, body in answers)
                lookups += 60
        assert counter_files() >= 2, "every lookup went to one gunicorn worker"
        status, body = web.get("/metrics")
        assert status == 200
        text = body.decode()
        assert _samples(text)['prewarm_route_lookups_total{result="ready"}'] == lookups  # summed over workers
        for name in REQUIRED:
            assert f"# TYPE {name} " in text, name
        if PROMTOOL:
            _promtool_check_metrics(text)
    finally:
        web.stop()


def test_the_scheduler_records_its_tick_without_importing_web(redis_url: str, tmp_path: Path) -> None:
    """A scheduler process ticks and observes prewarm_scheduler_tick_seconds with no web module loaded (the
    definition is in the core); web.metrics itself needs neither Flask nor torch."""
    import sys

    env = {**os.environ, "PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(make_catalog(tmp_path / "m")),
           "PREWARM_DATA_DIR": str(tmp_path)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    code = ("import sys\n"
            "from prewarm import metrics_defs\n"
            "from prewarm.context import Context\n"
            "from scheduler.live import Scheduler\n"
            "assert Scheduler(Context(start_redis=False), ident='t').safe_tick().leader\n"
            "h = metrics_defs.in_process(metrics_defs.SCHEDULER_TICK)\n"
            "count = next(s.value for m in h.collect() for s in m.samples if s.name.endswith('_count'))\n"
            "assert count == 1, count\n"
            "def samples(d):\n"
            "    return {s.name + str(sorted(s.labels.items())): s.value\n"
            "            for m in metrics_defs.in_process(d).collect() for s in m.samples}\n"
            "parts = samples(metrics_defs.SCHEDULER_TICK_PART)\n"
            "for part in ('snapshot', 'plan', 'dispatch'):\n"
            "    assert parts[f\"prewarm_scheduler_tick_part_seconds_count[('part', '{part}')]\"] == 1, parts\n"
            "trips = samples(metrics_defs.SCHEDULER_ROUND_TRIPS)\n"
            "assert trips['prewarm_scheduler_redis_round_trips_count[]'] == 1, trips\n"
            "assert trips['prewarm_scheduler_redis_round_trips_sum[]'] >= 3, trips  # lock, snapshot, status\n"
            "plans = samples(metrics_defs.SCHEDULER_PLAN_ACTIONS)\n"
            "assert plans['prewarm_scheduler_plan_actions_count[]'] == 1, plans\n"
            "loaded = [m for m in sys.modules if m == 'web' or m.startswith(('web.', 'flask', 'gpu_worker'))]\n"
            "assert not loaded, loaded\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code = "import sys, web.metrics; assert 'flask' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_a_scheduler_tick_shows_in_the_exposition(client: FlaskClient, redis_url: str, tmp_path: Path) -> None:
    from scheduler.live import Scheduler

    def ticks() -> float:
        return _samples(client.get("/metrics").get_data(as_text=True))["prewarm_scheduler_tick_seconds_count"]

    before = ticks()
    res = Scheduler(make_context(redis_url, make_catalog(tmp_path / "sched")), ident="t").safe_tick()
    assert res is not None and res.leader
    assert ticks() == before + 1  # the scheduler's observation, through the one shared definition


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
