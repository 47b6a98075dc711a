"""prewarm.client against a real `prewarm web`, and the example router end to end with a real worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
import redis
from werkzeug.serving import make_server

from prewarm import traffic
from prewarm.client import TrafficReporter
from prewarm.redis_server import EmbeddedRedis, free_port
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.web_support import WebProc, make_catalog, make_context, publish_gpu, replica
from web.app import create_app

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


class _GatedHooks:
    """The real web app in-process, with each POST /hooks/requests held until the test lets it through:
    the flusher's batches are then in flight exactly as long as the test says."""

    def __init__(self, redis_url: str, catalog: Path) -> None:
        self.app = create_app(make_context(redis_url, catalog))
        self.passes = threading.Semaphore(0)
        self.held = threading.Semaphore(0)  # one release per POST that has reached the gate
        self.server = make_server("127.0.0.1", 0, self._wsgi, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _wsgi(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] == "POST" and environ["PATH_INFO"] == "/hooks/requests":
            self.held.release()
            assert self.passes.acquire(timeout=60), "the test never let this post through"
        return self.app(environ, start_response)

    def wait_held(self) -> None:
        assert self.held.acquire(timeout=30), "no batch reached prewarm"

    def stop(self) -> None:
        self.passes.release(100)
        self.server.shutdown()


def _report_from_threads(rep: TrafficReporter, model: str, n: int, threads: int = 4) -> None:
    def work() -> None:
        for _ in range(n // threads):
            rep.report(model)
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def test_flush_waits_for_the_batch_in_flight_and_the_one_after_it(redis_url: str, catalog: Path,
                                                                  r: redis.Redis) -> None:
    # The flaky miss (1,953 of 2,000 counted after flush() returned True): flush() looked only at the
    # buffer once the flusher was between cycles, so a cycle that had just taken the buffer was missed.
    gate = _GatedHooks(redis_url, catalog)
    rep = TrafficReporter(gate.url, flush_interval=3600, batch_size=1000)  # cycles only when asked
    try:
        for round_ in range(1, 4):
            _report_from_threads(rep, "alpha", 1000)  # the 1,000th report wakes the flusher ...
            gate.wait_held()  # ... whose batch is now in flight, held
            _report_from_threads(rep, "beta", 400)  # buffered behind it, from several threads
            done: list[bool] = []
            flusher = threading.Thread(target=lambda out=done: out.append(rep.flush(30)))
            flusher.start()
            gate.passes.release()  # the first batch completes; flush() has the next cycle start at once
            gate.wait_held()  # the second (beta) is in flight, held
            flusher.join(0.5)
            assert not done, "flush() returned while a batch it had to wait for was still in flight"
            gate.passes.release()
            flusher.join(30)
            assert done == [True]
            assert traffic.totals(r) == {"alpha": 1000 * round_, "beta": 400 * round_}
        stats = rep.stats()
        assert stats["sent"] == stats["reported"] == 4200 and stats["dropped"] == stats["rejected"] == 0
    finally:
        rep.close()
        gate.stop()


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
    # Nothing listens, so each try is refused at once whatever the timeout; a short one would time out the
    # first post to the web once it is up on a loaded machine, which prewarm may still record, and the
    # counts resent after it would be counted twice.
    rep = TrafficReporter(f"http://127.0.0.1:{port}", flush_interval=0.05, max_pending=3, timeout=30.0)
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
        assert traffic.totals(r) == {"alpha": 20, "beta": 10, "gamma": 10}, rep.stats()
        assert rep.stats()["sent"] == 40
    finally:
        rep.close()
        if web is not None:
            web.stop()


def test_a_503_while_redis_is_away_is_resent_once_it_is_back(catalog: Path, tmp_path: Path) -> None:
    # What a Sentinel election looks like to the router: the web answers 503 with Retry-After for a few
    # seconds (tests/system/test_sentinel_failover.py has the real one); the reporter keeps the counts and
    # resends them, as after a timeout.
    port = free_port()
    server = EmbeddedRedis(port=port).start()
    web = WebProc(server.url, catalog, tmp_path, workers=1)
    rep = TrafficReporter(web.url, flush_interval=0.05)
    try:
        server.stop()
        rep.report("alpha", 5)
        wait_for(lambda: rep.stats()["failures"] >= 2, 30, what="posts answered 503")
        req = urllib.request.Request(web.url + "/hooks/requests", data=b'{"model": "alpha"}',
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 503 and refused.value.headers["Retry-After"]
        assert rep.stats()["sent"] == 0 and rep.stats()["pending"] == 1
        server = EmbeddedRedis(port=port).start()
        assert rep.flush(30)
        r = redis.Redis(port=port)
        assert traffic.totals(r) == {"alpha": 5}, rep.stats()
        r.close()
    finally:
        rep.close()
        web.stop()
        server.stop()


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

        def reporter() -> dict:
            return json.loads(urllib.request.urlopen(f"{url}/healthz", timeout=10).read())["reporter"]

        # the hook records a batch before it answers, and the reporter counts it sent when the answer comes: wait
        stats = wait_for(lambda: (s := reporter())["sent"] == 2 and s, 30, what="the reporter's count of the answer")
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


class _CompletionsServer:
    """A real HTTP server speaking the one call of the OpenAI API the router makes (POST /v1/completions),
    recording what it was sent: the replica's engine, for a test that needs no vLLM."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append((self.path, body))
                ok = self.path == "/v1/completions"
                out = json.dumps({"choices": [{"text": " world"}]} if ok else {"error": "no such route"}).encode()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_example_router_sends_an_engine_replica_an_openai_completions_request(
        web: WebProc, r: redis.Redis) -> None:
    engine = _CompletionsServer()
    ready = replica("alpha", GPU, "ready")
    ready.endpoint = engine.url
    publish_gpu(r, GPU, replicas=[ready])
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    router = subprocess.Popen([sys.executable, "examples/router.py", "--prewarm", web.url, "--port", str(port)],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url) or router.poll() is not None, 30, what="example router up")
        assert router.poll() is None, router.stdout.read().decode() if router.stdout else ""
        req = urllib.request.Request(f"{url}/v1/models/alpha/infer", method="POST",
                                     data=json.dumps({"prompt": "Hello", "max_tokens": 4}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = json.loads(resp.read())
        assert body["served_by"] == {"gpu": GPU, "model": "alpha", "via": "endpoint"}
        assert body["result"] == {"choices": [{"text": " world"}]}
        # the engine's base URL + /completions, the model under its catalog id
        assert engine.seen == [("/v1/completions", {"prompt": "Hello", "max_tokens": 4, "model": "alpha"})]
    finally:
        router.terminate()
        router.wait(timeout=20)
        engine.server.shutdown()
