"""An example request router in front of prewarm: a small HTTP proxy built on `prewarm.client`.

    python examples/router.py --prewarm http://127.0.0.1:8000 [--port 8080] [--redis-url URL] [--token T]

    POST /v1/models/<model>/infer      body: optional JSON {"inputs": ..., "seed": 0}
        -> 200 {"model", "served_by": {"gpu", "model", "via": "endpoint"|"queue"}, "cold", "result"}
        -> 503 {"error"} with Retry-After when no replica became ready within --cold-timeout
    GET  /healthz                       -> 200 {"status": "ok", "reporter": {...counts}}

For every request it (1) reports it (`TrafficReporter.report`: in memory, flushed in batches by a
background thread), (2) asks `route` where the model is warm (ready answers are cached briefly), and
(3) sends it to the first ready replica: to the replica's `endpoint` when it serves over HTTP (a vLLM
engine: the body is an OpenAI completions body, `{"prompt": "Hello", "max_tokens": 8}`, posted to
`<endpoint>/completions` with `model` set to the catalog id), else through the replica's GPU queue with prewarm's `infer` Celery task (the worker's own
path; needs `--redis-url`, the fleet's Redis). While the model is cold the route answer's `fallback`,
when there is one, is used instead (a URL, `{"endpoint": URL}`, or `{"model": id}` to serve with a model
that is warm); without one the request waits (re-asking with retry=1, so prewarm counts it once) up to
`--cold-timeout` seconds, as a router queues a request for a cold model.
It is an example: one process, the standard library's threading HTTP server, no retries of failed infers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from prewarm.client import TrafficReporter  # noqa: E402

log = logging.getLogger("prewarm.example.router")
_INFER = re.compile(r"^/v1/models/([A-Za-z0-9][A-Za-z0-9._-]{0,127})/infer$")


class Router:
    def __init__(self, reporter: TrafficReporter, redis_url: str | None, cold_timeout: float) -> None:
        self.reporter = reporter
        self.cold_timeout = cold_timeout
        self.celery = None
        if redis_url:
            from prewarm.celery_app import make_celery

            self.celery = make_celery(redis_url, name="prewarm-example-router")

    def serve(self, model: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.reporter.report(model)
        deadline = time.monotonic() + self.cold_timeout
        cold = False
        while True:
            answer = self.reporter.route(model, retry=cold)
            ready = [x for x in answer.get("replicas", []) if x.get("state") == "ready"]
            if ready:
                return 200, {"model": model, "cold": cold, **self._send(model, ready[0], body)}
            if answer.get("state") == "unknown":  # prewarm could not be asked at all
                return 502, {"error": f"no route for {model}: {answer.get('error')}"}
            fallback = answer.get("fallback")
            if fallback and not cold:
                served = self._fallback(model, fallback, body)
                if served is not None:
                    return 200, {"model": model, "cold": True, "fallback": True, **served}
            cold = True
            if time.monotonic() > deadline:
                return 503, {"error": f"{model} is {answer.get('state')}: no replica became ready within "
                                      f"{self.cold_timeout:.0f} s"}
            time.sleep(0.2)

    def _send(self, model: str, rep: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        if rep.get("endpoint"):
            # An engine's endpoint is the base URL of its OpenAI-compatible API (vLLM's /v1), serving the
            # model under its catalog id: the request body is a completions body ({"prompt", "max_tokens"}).
            return {"served_by": {"gpu": rep["gpu"], "model": model, "via": "endpoint"},
                    "result": _post_json(rep["endpoint"].rstrip("/") + "/completions", {**body, "model": model})}
        if self.celery is None:
            raise RuntimeError(f"{model} is served from GPU queue {rep['queue']}: start the router with "
                               "--redis-url (the fleet's Redis) to send infer tasks")
        from prewarm.celery_app import INFER

        res = self.celery.send_task(INFER, args=[model, body.get("inputs")],
                                    kwargs={"gpu": rep["gpu"], "version": rep.get("version"),
                                            "seed": int(body.get("seed", 0))}, queue=rep["queue"])
        try:
            result = res.get(timeout=60, propagate=True)
        finally:
            res.forget()
        return {"served_by": {"gpu": rep["gpu"], "model": model, "via": "queue"}, "result": result}

    def _fallback(self, model: str, fallback: Any, body: dict[str, Any]) -> dict[str, Any] | None:
        """Serve with the route answer's fallback: an endpoint URL, or another (warm) model."""
        endpoint = fallback if isinstance(fallback, str) else \
            fallback.get("endpoint") if isinstance(fallback, dict) else None
        if endpoint:
            return {"served_by": {"model": model, "via": "fallback-endpoint"}, "result": _post_json(endpoint, body)}
        other = fallback.get("model") if isinstance(fallback, dict) else None
        if other and other != model:
            answer = self.reporter.route(other)
            ready = [x for x in answer.get("replicas", []) if x.get("state") == "ready"]
            if ready:
                return self._send(other, ready[0], body)
        return None


def _post_json(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read() or b"null")


def make_handler(router: Router) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/healthz":
                self._answer(200, {"status": "ok", "reporter": router.reporter.stats()})
            else:
                self._answer(404, {"error": f"{self.path}: no such path; POST /v1/models/<model>/infer"})

        def do_POST(self) -> None:  # noqa: N802
            m = _INFER.match(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not m:
                return self._answer(404, {"error": f"{self.path}: no such path; POST /v1/models/<model>/infer"})
            try:
                body = json.loads(raw) if raw else {}
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except ValueError:
                return self._answer(400, {"error": 'body: a JSON object {"inputs"?, "seed"?} or nothing'})
            try:
                status, answer = router.serve(m.group(1), body)
            except Exception as exc:  # one failed request is an answer, not the end of the router
                log.warning("request for %s failed: %s", m.group(1), exc)
                status, answer = 502, {"error": f"{type(exc).__name__}: {exc}"}
            self._answer(status, answer, {"Retry-After": "2"} if status == 503 else None)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug(fmt, *args)

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prewarm", default=os.environ.get("PREWARM_URL", "http://127.0.0.1:8000"),
                    help="prewarm web's URL (default PREWARM_URL or http://127.0.0.1:8000)")
    ap.add_argument("--token", default=os.environ.get("PREWARM_HOOK_TOKEN"), help="hook token, if set")
    ap.add_argument("--redis-url", default=os.environ.get("PREWARM_REDIS_URL"),
                    help="the fleet's Redis, to run infer on queue-served replicas (default PREWARM_REDIS_URL)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--cold-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.redis_url:
        # `./run`'s embedded Redis writes its URL into the data directory (PREWARM_DATA_DIR, default var/)
        data_dir = os.environ.get("PREWARM_DATA_DIR") or Path(__file__).resolve().parent.parent / "var"
        up_file = Path(data_dir) / "redis.url"
        if up_file.exists():
            args.redis_url = up_file.read_text().strip()
    with TrafficReporter(args.prewarm, args.token) as reporter:
        server = ThreadingHTTPServer((args.host, args.port), make_handler(Router(reporter, args.redis_url,
                                                                                args.cold_timeout)))
        server.daemon_threads = True
        print(f"example router: http://{args.host}:{server.server_address[1]}/ -> {args.prewarm}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
