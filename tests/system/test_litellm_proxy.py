"""LiteLLM's proxy, started as examples/litellm/README.md says (its own venv, the example config, the checkout
on PYTHONPATH), in front of a real `prewarm web` whose ready replicas are OpenAI-compatible stand-ins
(bench/router/fleet.py): the headers it answers with, the fallback, the 429 with prewarm's ETA as
Retry-After, and prewarm's traffic counts against the requests sent.

Needs the proxy's environment (scripts/install-litellm-proxy.sh; ./test makes it); without it this skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import redis

from bench.router.fleet import StandinFleet, catalog, start_web
from bench.router.standin import OpenAIStandin
from prewarm import traffic
from prewarm.redis_server import EmbeddedRedis, free_port
from tests.procs import REPO, wait_for


def _proxy_bin() -> Path | None:
    try:
        pinned = version("litellm")  # the extra's pin, installed here
    except PackageNotFoundError:
        return None
    venv = Path(os.environ.get("PREWARM_LITELLM_VENV") or
                Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prewarm" / f"litellm-proxy-{pinned}")
    exe = venv / "bin" / "litellm"
    return exe if exe.is_file() and (venv / ".prewarm-litellm").is_file() else None


PROXY = _proxy_bin()
pytestmark = pytest.mark.skipif(PROXY is None, reason="LiteLLM's proxy is not installed: scripts/install-litellm-proxy.sh")

MODEL, SPARE = "tiny-llama-vllm", "tiny-llama-vllm-spare"  # the names examples/litellm/config.yaml serves
KEY = "sk-" + "5e" * 24  # the proxy's master key for this test
COLD_WAIT = 2.0


class Proxy:
    def __init__(self, url: str, work: Path) -> None:
        self.port = free_port()
        self.log = work / "proxy.log"
        self.sent = 0  # requests posted
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        env.update(PYTHONPATH=str(REPO), PREWARM_URL=url, PREWARM_LITELLM_COLD_WAIT=str(COLD_WAIT),
                   LITELLM_MASTER_KEY=KEY, LITELLM_LOCAL_MODEL_COST_MAP="True")
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([str(PROXY), "--config", str(REPO / "examples/litellm/config.yaml"),
                                          "--port", str(self.port)], env=env, cwd=work, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(self._live, 180, interval=0.5, what="LiteLLM's proxy to answer", log=self._log)

    def _log(self) -> str:
        return self.log.read_text(errors="replace")

    def _live(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the proxy exited with {self.proc.returncode}:\n{self._log()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=2):
                return True
        except OSError:
            return False

    def post(self, path: str, body: dict) -> tuple[int, dict[str, str], dict]:
        self.sent += 1
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, {k.lower(): v for k, v in err.headers.items()}, json.loads(err.read() or b"{}")

    def chat(self, model: str = MODEL) -> tuple[int, dict[str, str], dict]:
        return self.post("/v1/chat/completions", {"model": model, "max_tokens": 4,
                                                  "messages": [{"role": "user", "content": "hello"}]})

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def setup() -> Iterator[tuple[StandinFleet, Proxy, dict[str, OpenAIStandin], str]]:
    work = Path(tempfile.mkdtemp(prefix="prewarm-litellm-proxy-"))
    server = EmbeddedRedis().start()
    standins = {name: OpenAIStandin(name).start() for name in ("replica", "spare")}
    fleet = StandinFleet(server.url)
    web = proxy = None
    try:
        web, url = start_web(server.url, catalog(work, MODEL, SPARE), work)
        fleet.set("node/cpu:0", [(MODEL, standins["replica"].endpoint)])
        fleet.set("node/cpu:1", [(SPARE, standins["spare"].endpoint)])
        fleet.start()
        proxy = Proxy(url, work)
        yield fleet, proxy, standins, server.url
    finally:
        if proxy is not None:
            proxy.stop()
        fleet.stop()
        if web is not None:
            web.terminate()
            web.wait(15)
        for s in standins.values():
            s.stop()
        server.stop()


def test_the_example_proxy_routes_falls_back_refuses_with_the_eta_and_reports(setup) -> None:  # noqa: ANN001
    fleet, proxy, standins, redis_url = setup
    status, headers, body = proxy.chat()
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "served by replica"
    assert headers["x-prewarm-served-by"] == MODEL and headers["x-prewarm-gpu"] == "node/cpu:0"
    assert headers["x-litellm-model-id"] == f"prewarm:{MODEL}@v1:node/cpu:0" and "x-prewarm-fallback" not in headers
    status, headers, body = proxy.post("/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 4})
    assert status == 200 and body["choices"][0]["text"] == "served by replica"

    fleet.set("node/cpu:0", [])  # evicted: the fallback serves, and the answer says so
    wait_for(lambda: proxy.chat()[1].get("x-prewarm-fallback") == MODEL, 10, interval=0.3,
             what="an answer served by the fallback")
    status, headers, body = proxy.chat()
    assert status == 200 and body["choices"][0]["message"]["content"] == "served by spare"
    assert headers["x-prewarm-served-by"] == SPARE and standins["spare"].seen[-1] == SPARE

    fleet.set("node/cpu:1", [])  # no fallback warm either: a bounded wait, then LiteLLM's 429 with the ETA
    wait_for(lambda: proxy.chat()[0] == 429, 30, interval=0.3, what="a 429 once nothing is warm")
    status, headers, body = proxy.chat()
    assert status == 429 and "No deployments available" in body["error"]["message"]
    # prewarm's ETA, whole seconds: the strategy's cooldown_time, which the proxy answers as Retry-After.
    assert int(headers["retry-after"]) >= 1

    # Every request was reported once (the refused ones too: they were asked for), none as the fallback's.
    r = redis.Redis.from_url(redis_url)
    try:
        wait_for(lambda: traffic.totals(r).get(MODEL, 0) >= proxy.sent, 10, what="the proxy's reports to land")
        assert {m: traffic.totals(r).get(m, 0) for m in (MODEL, SPARE)} == {MODEL: proxy.sent, SPARE: 0}
    finally:
        r.close()
