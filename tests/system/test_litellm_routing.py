"""LiteLLM's Router with prewarm's routing strategy against a real `prewarm web`, real Redis and real HTTP
servers as the replicas' endpoints (bench/router/standin.py), the fleet published with the worker's own
heartbeat function: the integration's logic without an engine start. tests/system/test_litellm.py runs it in
front of a real vLLM engine replica placed by a real worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from safetensors.numpy import save_file

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of LiteLLM's price list

litellm = pytest.importorskip("litellm", reason="the litellm extra is not installed: pip install prewarm[litellm]")

from litellm import Router  # noqa: E402
from litellm.types.router import RouterRateLimitError  # noqa: E402

from bench.router.standin import OpenAIStandin  # noqa: E402
from prewarm import traffic  # noqa: E402
from prewarm.client import TrafficReporter  # noqa: E402
from prewarm.integrations.litellm import PrewarmRouting, model_groups  # noqa: E402
from prewarm.integrations.litellm.proxy import response_headers  # noqa: E402
from tests.procs import wait_for  # noqa: E402
from tests.web_support import WebProc, publish_gpu, queued_tasks, replica  # noqa: E402

MSG = [{"role": "user", "content": "hello"}]
GPU0, GPU1, GPU2 = "node/cpu:0", "node/cpu:1", "node/cpu:2"


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    lines = []
    for model, extra in {"chat-a": 'fallback = "chat-b"', "chat-b": "", "chat-c": "", "plain": ""}.items():
        save_file({"w": np.zeros((256,), dtype=np.float32)}, str(root / f"{model}.safetensors"))
        lines += ["[[models]]", f'id = "{model}"', 'version = "v1"', f'weights = "{model}.safetensors"',
                  'builder = "json:loads"', extra, "[[models.warmup]]", "shape = [1, 4]", ""]
    (root / "catalog.toml").write_text("\n".join(lines))
    return root / "catalog.toml"


@pytest.fixture
def standins() -> Iterator[dict[str, OpenAIStandin]]:
    made = {name: OpenAIStandin(name).start() for name in ("a0", "a1", "b2", "c0")}
    yield made
    for s in made.values():
        s.stop()


@pytest.fixture
def routing(web: WebProc) -> Iterator[PrewarmRouting]:
    reporter = TrafficReporter(web.url, route_ttl=0.2)
    strategy = PrewarmRouting(reporter=reporter, cold_wait=2.0, poll=0.1)
    yield strategy
    reporter.close()


def served(model: str, gid: str, endpoint: str | None) -> object:
    return dataclasses.replace(replica(model, gid), endpoint=endpoint)


def publish(r: redis.Redis, fleet: dict[str, list[object]]) -> None:
    for gid, reps in fleet.items():
        publish_gpu(r, gid, replicas=reps)  # type: ignore[arg-type]


def router(strategy: PrewarmRouting, **kw: object) -> Router:
    rt = Router(model_list=model_groups(["chat-a", "chat-b", "chat-c", "plain"]), **kw)
    rt.register_plugin(strategy)
    return rt


def ask(rt: Router, model: str = "chat-a", **kw: object) -> tuple[str, dict]:
    md: dict = dict(kw.pop("metadata", {}) or {})  # type: ignore[call-overload]
    resp = asyncio.run(rt.acompletion(model=model, messages=MSG, metadata=md, **kw))
    return resp.choices[0].message.content, md


def test_warm_requests_go_to_ready_replicas_that_prewarm_moves_and_are_reported_once(
        web: WebProc, r: redis.Redis, routing: PrewarmRouting, standins: dict[str, OpenAIStandin]) -> None:
    a0, a1, b2 = standins["a0"], standins["a1"], standins["b2"]
    publish(r, {GPU0: [served("chat-a", GPU0, a0.endpoint)], GPU1: [], GPU2: [served("chat-b", GPU2, b2.endpoint)]})
    rt = router(routing)

    text, md = ask(rt)
    assert text == "served by a0" and a0.seen == ["chat-a"]  # the engine is asked for the catalog id
    assert md["prewarm"]["served_by"] == "chat-a" and md["prewarm"]["gpu"] == GPU0
    assert md["prewarm"]["endpoint"] == a0.endpoint and md["prewarm"]["fallback"] is False
    assert response_headers({"metadata": md}) == {"x-prewarm-served-by": "chat-a", "x-prewarm-gpu": GPU0}

    # A second replica appears on another GPU: it gets requests with no change to the router.
    publish(r, {GPU1: [served("chat-a", GPU1, a1.endpoint)]})
    wait_for(lambda: (ask(rt), a1.count())[1] > 0, 20, interval=0.05, what="the new replica to get requests")
    before = (a0.count(), a1.count())
    for _ in range(6):
        ask(rt)
    assert a0.count() > before[0] and a1.count() > before[1]  # idle replicas taken in turn

    # The first replica goes (evicted): no request is sent to it any more.
    publish(r, {GPU0: []})
    time.sleep(routing.reporter.route_ttl)
    left = a0.count()
    for _ in range(4):
        assert ask(rt)[0] == "served by a1"
    assert a0.count() == left

    # Every request was reported once: prewarm's traffic counts are the requests sent.
    sent = len(a0.seen) + len(a1.seen)
    assert routing.reporter.flush(10)
    assert traffic.totals(r).get("chat-a") == sent


def test_a_retry_is_not_counted_again(web: WebProc, r: redis.Redis, routing: PrewarmRouting,
                                      standins: dict[str, OpenAIStandin]) -> None:
    a1 = standins["a1"]
    dead = "http://127.0.0.1:9/v1"  # a replica whose engine died since its last heartbeat
    publish(r, {GPU0: [served("chat-a", GPU0, dead)], GPU1: [served("chat-a", GPU1, a1.endpoint)]})
    rt = router(routing, num_retries=3, retry_after=0)
    shared = {"priority": "normal"}  # one metadata dict for every request, as a caller may keep one
    for _ in range(4):
        resp = asyncio.run(rt.acompletion(model="chat-a", messages=MSG, metadata=shared))
        assert resp.choices[0].message.content == "served by a1"  # a pick of the dead one fails, LiteLLM retries
    assert routing.reporter.flush(10)
    assert traffic.totals(r).get("chat-a") == 4


def test_a_cold_model_is_served_by_its_fallback_and_says_so(web: WebProc, r: redis.Redis, routing: PrewarmRouting,
                                                            standins: dict[str, OpenAIStandin]) -> None:
    b2 = standins["b2"]
    publish(r, {GPU0: [], GPU2: [served("chat-b", GPU2, b2.endpoint)]})
    rt = router(routing)
    text, md = ask(rt, metadata={"priority": "high"})
    assert text == "served by b2" and b2.seen == ["chat-b"]
    stamp = md["prewarm"]
    assert stamp["fallback"] is True and stamp["served_by"] == "chat-b" and stamp["model"] == "chat-a"
    assert stamp["state"] in ("cold", "loading") and stamp["eta_seconds"] > 0
    assert response_headers({"metadata": md})["x-prewarm-fallback"] == "chat-a"
    # The lookup placed chat-a's on-demand preload, at the priority the request's metadata gave.
    sent = [t for g in (GPU0, GPU2) for t in queued_tasks(r, f"gpu.node.cpu:{g[-1]}")]
    assert sent and all("'priority': 'high'" in t["headers"]["kwargsrepr"] for t in sent), sent
    assert routing.reporter.flush(10)
    assert traffic.totals(r).get("chat-a") == 1 and "chat-b" not in traffic.totals(r)


def test_a_cold_model_without_fallback_waits_for_its_replica(web: WebProc, r: redis.Redis,
                                                             standins: dict[str, OpenAIStandin]) -> None:
    c0 = standins["c0"]
    publish(r, {GPU0: []})
    with TrafficReporter(web.url) as reporter:
        rt = router(PrewarmRouting(reporter=reporter, cold_wait=30.0, poll=0.1))
        threading.Timer(1.0, lambda: publish(r, {GPU0: [served("chat-c", GPU0, c0.endpoint)]})).start()
        text, md = ask(rt, "chat-c")
        assert text == "served by c0" and md["prewarm"]["waited_s"] > 0 and md["prewarm"]["fallback"] is False
        assert reporter.flush(10)
        assert traffic.totals(r).get("chat-c") == 1  # the repeat lookups (retry=1) are not requests


def test_past_the_bound_it_is_litellms_no_deployment_error_with_prewarms_eta(
        web: WebProc, r: redis.Redis, routing: PrewarmRouting) -> None:
    publish(r, {GPU0: []})
    rt = router(routing, num_retries=2)
    t0 = time.monotonic()
    with pytest.raises(RouterRateLimitError) as err:
        ask(rt, "chat-c")
    assert time.monotonic() - t0 >= routing.cold_wait  # it waited the bound, once (not once per retry)
    eta = err.value.cooldown_time
    assert eta >= 1 and err.value.litellm_response_headers == {"retry-after": str(int(eta))}
    assert "Try again in" in str(err.value)


def test_streaming_passes_through_and_text_completions_route_too(web: WebProc, r: redis.Redis,
                                                                 routing: PrewarmRouting,
                                                                 standins: dict[str, OpenAIStandin]) -> None:
    a0 = standins["a0"]
    publish(r, {GPU0: [served("chat-a", GPU0, a0.endpoint)]})
    rt = router(routing)

    async def stream() -> list[str]:
        chunks = await rt.acompletion(model="chat-a", messages=MSG, stream=True)
        return [c.choices[0].delta.content or "" async for c in chunks]

    pieces = asyncio.run(stream())
    assert "".join(pieces) == "served by a0" and len([p for p in pieces if p]) == 3  # the engine's own chunks
    text = asyncio.run(rt.atext_completion(model="chat-a", prompt="hello"))
    assert text.choices[0].text == "served by a0"
    sync = rt.completion(model="chat-a", messages=MSG)  # the sync pick
    assert sync.choices[0].message.content == "served by a0"


def test_what_litellm_cannot_serve_is_refused_with_the_reason(web: WebProc, r: redis.Redis,
                                                              routing: PrewarmRouting) -> None:
    publish(r, {GPU0: [served("plain", GPU0, None)]})
    rt = router(routing)
    with pytest.raises(litellm.BadRequestError, match="not a model in prewarm's catalog"):
        ask(rt, "no-such-model")
    with pytest.raises(litellm.BadRequestError, match="infer queue"):
        ask(rt, "plain")
    with pytest.raises(litellm.BadRequestError, match="metadata.priority: one of high, normal, low, got 'urgent'"):
        ask(rt, "chat-a", metadata={"priority": "urgent"})
    with pytest.raises(ValueError, match="cold_wait"):
        PrewarmRouting("http://127.0.0.1:1", cold_wait=float("nan"))
    with pytest.raises(ValueError, match="url"):
        PrewarmRouting()
    with pytest.raises(ValueError, match="provider"):
        PrewarmRouting("http://127.0.0.1:1", provider="hosted_vllm/x")
    with pytest.raises(ValueError, match="models: a list of catalog model ids"):
        model_groups("chat-a")  # type: ignore[arg-type]


def test_the_proxy_callback_puts_the_strategy_on_a_router_and_says_where_it_went(
        web: WebProc, r: redis.Redis, routing: PrewarmRouting, standins: dict[str, OpenAIStandin]) -> None:
    from prewarm.integrations.litellm.proxy import PrewarmCallback

    b2 = standins["b2"]
    publish(r, {GPU0: [], GPU2: [served("chat-b", GPU2, b2.endpoint)]})
    rt = Router(model_list=model_groups(["chat-a"]))  # as the proxy builds it: the names only
    callback = PrewarmCallback(routing)
    callback.install(rt)
    callback.install(rt)  # once per router: every request's hook calls it
    data: dict = {"metadata": {}}
    resp = asyncio.run(rt.acompletion(model="chat-a", messages=MSG, metadata=data["metadata"]))
    assert resp.choices[0].message.content == "served by b2"
    headers = asyncio.run(callback.async_post_call_response_headers_hook(data, None, resp))
    assert headers == {"x-prewarm-served-by": "chat-b", "x-prewarm-gpu": GPU2, "x-prewarm-fallback": "chat-a"}


def test_bench_router_reports_the_issues_keys_and_no_failure_with_a_fallback() -> None:
    import json
    import subprocess
    import sys

    from tests.procs import REPO

    out = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "bench", "router", "--requests", "4",
                          "--cold-requests", "2", "--cold-seconds", "1", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    from importlib.metadata import version

    assert set(r) == {"warm", "cold", "litellm_version"} and r["litellm_version"] == version("litellm")
    assert {k: set(v) for k, v in r["warm"].items()} == {"integration": {"p50_ms", "p99_ms"},
                                                         "static": {"p50_ms", "p99_ms"}}
    assert set(r["cold"]) == {"requests", "failed", "served_by_fallback", "wait_seconds", "eta_seconds"}
    assert set(r["cold"]["wait_seconds"]) == {"p50", "max"}
    # 2 requests while cold, all served by the fallback, then 1 once the replica is back.
    assert (r["cold"]["requests"], r["cold"]["failed"], r["cold"]["served_by_fallback"]) == (3, 0, 2)
    assert r["cold"]["eta_seconds"] > 0 and r["warm"]["integration"]["p50_ms"] > 0
