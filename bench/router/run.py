"""`prewarm bench router`: LiteLLM's Router with prewarm's routing strategy against LiteLLM with a static
`model_list` pointing at the same replica, and a model that goes cold and comes back.

What runs: an embedded Redis, a real `prewarm web` (gunicorn) over a two-model catalog (`bench-chat`, with
`bench-spare` as its catalog fallback), and two OpenAI-compatible servers standing in for the replicas'
engines (bench/router/standin.py), announced to prewarm as ready replicas with the worker's own heartbeat
record. The engine is a stand-in so the figure is the router's own cost, not a CPU-bound engine's noise.

- warm: `requests` chat completions, alternating between the two routers (same replica, same process):
  p50 / p99 of each, in ms.
- cold: the model's replica goes (as an eviction does), `cold_requests` requests are sent while it is away
  (`cold_seconds`), then it comes back and one more is sent: how many failed, how many the fallback served,
  how long each waited for its answer (p50, max) beside prewarm's ETA for the model.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.router.fleet import BenchError

MODEL, SPARE = "bench-chat", "bench-spare"
MSG = [{"role": "user", "content": "hello"}]


__all__ = ["BenchError", "run_bench"]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def run_bench(requests: int = 200, cold_requests: int = 20, cold_seconds: float = 3.0,
              log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    if requests < 2 or cold_requests < 1 or not 0 < cold_seconds < math.inf:
        raise BenchError("--requests must be >= 2, --cold-requests >= 1 and --cold-seconds > 0")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of LiteLLM's price list
    try:
        from litellm import Router
    except ImportError:
        raise BenchError("LiteLLM is not installed: pip install prewarm[litellm]") from None
    from bench.router.fleet import StandinFleet, catalog, start_web
    from bench.router.standin import OpenAIStandin
    from prewarm.client import TrafficReporter
    from prewarm.integrations.litellm import PrewarmRouting, model_groups
    from prewarm.redis_server import EmbeddedRedis

    work = Path(tempfile.mkdtemp(prefix="prewarm-bench-router-"))
    redis_server = EmbeddedRedis().start()
    engine, spare = OpenAIStandin("replica").start(), OpenAIStandin("spare").start()
    web = None
    fleet = StandinFleet(redis_server.url)
    try:
        web, url = start_web(redis_server.url, catalog(work, MODEL, SPARE), work)
        fleet.set("bench/cpu:0", [(MODEL, engine.endpoint)])
        fleet.set("bench/cpu:1", [(SPARE, spare.endpoint)])
        fleet.start()
        reporter = TrafficReporter(url)
        routing = PrewarmRouting(reporter=reporter, cold_wait=max(30.0, 2 * cold_seconds))
        integrated = Router(model_list=model_groups([MODEL, SPARE]))
        integrated.register_plugin(routing)
        static = Router(model_list=[{"model_name": MODEL, "litellm_params": {"model": f"hosted_vllm/{MODEL}",
                                                                              "api_base": engine.endpoint}}])

        async def once(rt: Any, md: dict[str, Any] | None = None) -> float:
            t0 = time.perf_counter()
            await rt.acompletion(model=MODEL, messages=MSG, metadata=md if md is not None else {})
            return time.perf_counter() - t0

        async def warm() -> tuple[list[float], list[float]]:
            for rt in (integrated, static):  # clients made, connections open, caches filled
                for _ in range(5):
                    await once(rt)
            a: list[float] = []
            b: list[float] = []
            for i in range(requests):  # alternating, so drift in the machine's load falls on both
                first, second = (integrated, static) if i % 2 == 0 else (static, integrated)
                x, y = await once(first), await once(second)
                a.append(x if first is integrated else y)
                b.append(y if first is integrated else x)
            return a, b

        log(f"warm: {requests} requests through each router")
        via, direct = asyncio.run(warm())

        async def cold() -> dict[str, Any]:
            fleet.set("bench/cpu:0", [])  # the replica goes: the model is cold, its fallback is warm
            await asyncio.sleep(routing.reporter.route_ttl)  # what a router may still hold of the last answer
            waits, failed, by_fallback, etas = [], 0, 0, []
            gap = cold_seconds / cold_requests
            for i in range(cold_requests + 1):
                if i == cold_requests:
                    fleet.set("bench/cpu:0", [(MODEL, engine.endpoint)])  # back
                    await asyncio.sleep(routing.reporter.route_ttl)
                md: dict[str, Any] = {}
                try:
                    waits.append(await once(integrated, md))
                except Exception:  # noqa: BLE001 - any failure of a request is what is counted here
                    failed += 1
                stamp = md.get("prewarm") or {}
                by_fallback += bool(stamp.get("fallback"))
                if stamp.get("eta_seconds") is not None:
                    etas.append(float(stamp["eta_seconds"]))
                await asyncio.sleep(gap)
            return {"requests": cold_requests + 1, "failed": failed, "served_by_fallback": by_fallback,
                    "wait_seconds": {"p50": round(statistics.median(waits), 4) if waits else None,
                                     "max": round(max(waits), 4) if waits else None},
                    "eta_seconds": round(statistics.median(etas), 3) if etas else None}

        log(f"cold: the replica goes for {cold_seconds:.0f} s, {cold_requests} requests meanwhile, then it is back")
        cold_report = asyncio.run(cold())
        reporter.close()
    finally:
        fleet.stop()
        if web is not None:
            web.terminate()
            try:
                web.wait(15)
            except subprocess.TimeoutExpired:
                web.kill()
        engine.stop()
        spare.stop()
        redis_server.stop()
        shutil.rmtree(work, ignore_errors=True)  # the catalog, weights and logs: every run left its folder

    def ms(xs: list[float]) -> dict[str, float]:
        return {"p50_ms": round(1000 * statistics.median(xs), 3), "p99_ms": round(1000 * _pct(xs, 0.99), 3)}

    return {"warm": {"integration": ms(via), "static": ms(direct)}, "cold": cold_report,
            "litellm_version": _litellm_version()}


def _litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")
