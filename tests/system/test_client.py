"""prewarm.client against a real `prewarm web`, and the example router end to end with a real worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from prewarm import traffic
from prewarm.client import TrafficReporter
from prewarm.redis_server import free_port
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.web_support import WebProc, make_catalog, publish_gpu, replica

REPO = Path(__file__).resolve().parents[2]
GPU = "node-a/cpu:0"


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return make_catalog(tmp_path / "models")


@pytest.fixture
def reporter(web: WebProc) -> Iterator[TrafficReporter]:
    rep = TrafficReporter(web.url)
    yield rep
    rep.close()


def test_reported_requests_reach_the_traffic_store_in_batches(reporter: TrafficReporter, r: redis.Redis) -> None:
    for i in range(2500):
        reporter.report("alpha" if i % 5 else "beta")
    reporter.report("gamma", count=7)
    assert reporter.flush(30)
    assert traffic.totals(r) == {"alpha": 2000, "beta": 500, "gamma": 7}
    stats = reporter.stats()
    assert stats["reported"] == stats["sent"] == 2507 and stats["dropped"] == stats["rejected"] == 0
    # Counts kept per (model, second) and sent with their timestamps: they land in the seconds they happened.
    window = traffic.read_seconds(r, time.time() - 120, time.time() + 2)
    assert window.total("alpha") == 2000 and window.total("gamma") == 7


def test_an_unknown_model_is_dropped_and_the_rest_of_its_batch_recorded(reporter: TrafficReporter,
                                                                       r: redis.Redis) -> None:
    # A batch is all-or-nothing on the server: the client resends it without the event refused.
    reporter.report("alpha", 3)
    reporter.report("no-such-model", 2)
    reporter.report("beta")
    assert reporter.flush(30)
    assert traffic.totals(r) == {"alpha": 3, "beta": 1}
    assert reporter.stats()["rejected"] == 2 and reporter.stats()["sent"] == 4


def test_while_prewarm_is_unreachable_counts_are_kept_bounded_then_delivered(
        redis_url: str, catalog: Path, tmp_path: Path, r: redis.Redis) -> None:
    port = free_port()
    rep = TrafficReporter(f"http://127.0.0.1:{port}", flush_interval=0.05, max_pending=3, timeout=1.0)
    web = None
    try:
        for model in ("alpha", "beta", "gamma", "alpha"):
            rep.report(model, 10)  # nothing listens: report() neither blocks nor raises
        rep.report("delta", 4)  # a fourth (model, second) entry does not fit: dropped, and counted
        wait_for(lambda: rep.stats()["failures"] >= 2, 30, what="failed flushes")
        stats = rep.stats()
        assert stats["pending"] == 3 and stats["dropped"] == 4 and stats["sent"] == 0, stats
        assert rep.route("alpha")["state"] == "unknown"  # no answer to give, and no exception either
        web = WebProc(redis_url, catalog, tmp_path, workers=1, port=port)
        assert rep.flush(30)  # the buffered counts go out once prewarm answers
        assert traffic.totals(r) == {"alpha": 20, "beta": 10, "gamma": 10}
        assert rep.stats()["sent"] == 40
    finally:
        rep.close()
        if web is not None:
            web.stop()


def test_route_caches_ready_answers_only(reporter: TrafficReporter, r: redis.Redis) -> None:
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "ready"), replica("beta", GPU, "loading", progress=0.5)])
    first = reporter.route("alpha")
    assert first["state"] == "ready" and first["replicas"][0]["gpu"] == GPU
    assert reporter.route("beta")["state"] == "loading"
    publish_gpu(r, GPU, replicas=[replica("alpha", GPU, "evicting"), replica("beta", GPU, "ready")])
    assert reporter.route("alpha") is first  # within route_ttl: the cached ready answer, no round trip
    assert reporter.route("beta")["state"] == "ready"  # a loading answer was not cached
    assert reporter.route("alpha", retry=True)["state"] != "ready"  # a retry always asks


# --- the example router, end to end: real web, real worker, real Celery infer ---------------------------
def _post(url: str, timeout: float = 180) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.slow
def test_example_router_serves_a_cold_model_once_warm_and_reports_every_request(
        redis_url: str, r: redis.Redis, tmp_path: Path, worker_factory) -> None:  # noqa: F811
    cat = tiny_catalog(tmp_path / "tiny", ["tiny-mlp"])
    w = worker_factory(cat, devices="cpu:0=256MiB")
    web = WebProc(redis_url, cat, tmp_path, workers=1)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    router = subprocess.Popen([sys.executable, "examples/router.py", "--prewarm", web.url, "--redis-url", redis_url,
                               "--port", str(port), "--cold-timeout", "120"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url) or router.poll() is not None, 30, what="example router up")
        assert router.poll() is None, router.stdout.read().decode() if router.stdout else ""
        # Cold: the route lookup queues one on-demand preload; the router waits, then infers on the replica.
        status, body = _post(f"{url}/v1/models/tiny-mlp/infer")
        assert status == 200, body
        assert body["cold"] is True and body["served_by"]["via"] == "queue"
        assert body["served_by"]["gpu"] == w.gpu_ids[0] and body["result"]["output"]["finite"] is True
        # Warm: served at once.
        status, body = _post(f"{url}/v1/models/tiny-mlp/infer")
        assert status == 200 and body["cold"] is False, body
        status, body = _post(f"{url}/v1/models/not-in-catalog/infer", timeout=30)
        assert status == 502 and "not-in-catalog" in body["error"]
        # Every request reached prewarm's traffic store through the reporter (the unknown id refused).
        wait_for(lambda: traffic.totals(r).get("tiny-mlp") == 2, 30, what="both requests recorded")
        stats = json.loads(urllib.request.urlopen(f"{url}/healthz", timeout=10).read())["reporter"]
        assert stats["reported"] == 3 and stats["sent"] == 2 and stats["dropped"] == 0
    finally:
        router.terminate()
        router.wait(timeout=20)
        web.stop()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
