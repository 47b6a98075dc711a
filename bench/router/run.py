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
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL, SPARE = "bench-chat", "bench-spare"
MSG = [{"role": "user", "content": "hello"}]


class BenchError(RuntimeError):
    """The benchmark cannot run (LiteLLM missing, the web did not start); the message says why."""


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _catalog(root: Path) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    lines = []
    for model, extra in ((MODEL, f'fallback = "{SPARE}"'), (SPARE, "")):
        save_file({"w": np.zeros((256,), dtype=np.float32)}, str(root / f"{model}.safetensors"))
        lines += ["[[models]]", f'id = "{model}"', 'version = "v1"', f'weights = "{model}.safetensors"',
                  'builder = "json:loads"', extra, "[[models.warmup]]", "shape = [1, 4]", ""]
    (root / "catalog.toml").write_text("\n".join(lines))
    return root / "catalog.toml"


class _Fleet:
    """The replicas as prewarm sees them: each GPU re-announced every second (TTL 5 s), as a worker does."""

    def __init__(self, redis_url: str) -> None:
        import redis

        self.r = redis.Redis.from_url(redis_url)
        self.replicas: dict[str, list[Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="bench-heartbeat", daemon=True)

    def set(self, gid: str, replicas: list[tuple[str, str]]) -> None:
        """`gid` now holds these (model, endpoint) ready replicas, announced at once."""
        from prewarm import state
        from prewarm.domain import states as rs

        now = time.time()
        reps = [state.Replica(model=m, version="v1", gpu=gid, state=rs.READY, bytes=1 << 20, total_bytes=1 << 20,
                              progress=1.0, since=now, created_at=now, endpoint=ep) for m, ep in replicas]
        with self._lock:
            self.replicas[gid] = reps
            self._announce(gid, reps)

    def _announce(self, gid: str, reps: list[Any]) -> None:
        from prewarm import state

        node, _, device = gid.partition("/")
        total = 4 << 30
        used = sum(x.bytes for x in reps)
        g = state.Gpu(id=gid, node=node, device=device, queue=state.queue_name(node, device), total_bytes=total,
                      used_bytes=used, free_bytes=total - used, last_heartbeat=time.time(), worker="bench-router",
                      started_at=time.time(), kind="cpu", heartbeat_seconds=1.0)
        state.write_heartbeat(self.r, g, reps, 5.0)

    def start(self) -> _Fleet:
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                for gid, reps in self.replicas.items():
                    self._announce(gid, reps)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.r.close()


def _start_web(redis_url: str, catalog: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    from prewarm.redis_server import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update(PREWARM_REDIS_URL=redis_url, PREWARM_CATALOG=str(catalog), PORT=str(port),
               PREWARM_DATA_DIR=str(work / "web-data"), PROMETHEUS_MULTIPROC_DIR=str(work / "prom"))
    (work / "prom").mkdir()
    log = open(work / "web.log", "wb")  # noqa: SIM115 - the process writes it for its whole life
    proc = subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", "web", "--host", "127.0.0.1",
                             "--workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise BenchError(f"prewarm web did not start: {(work / 'web.log').read_text(errors='replace')[-2000:]}")


def run_bench(requests: int = 200, cold_requests: int = 20, cold_seconds: float = 3.0,
              log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    if requests < 2 or cold_requests < 1 or cold_seconds <= 0:
        raise BenchError("--requests must be >= 2, --cold-requests >= 1 and --cold-seconds > 0")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of LiteLLM's price list
    try:
        from litellm import Router
    except ImportError:
        raise BenchError("LiteLLM is not installed: pip install prewarm[litellm]") from None
    from bench.router.standin import OpenAIStandin
    from prewarm.client import TrafficReporter
    from prewarm.integrations.litellm import PrewarmRouting, model_groups
    from prewarm.redis_server import EmbeddedRedis

    work = Path(tempfile.mkdtemp(prefix="prewarm-bench-router-"))
    redis_server = EmbeddedRedis().start()
    engine, spare = OpenAIStandin("replica").start(), OpenAIStandin("spare").start()
    web = None
    fleet = _Fleet(redis_server.url)
    try:
        web, url = _start_web(redis_server.url, _catalog(work), work)
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

    def ms(xs: list[float]) -> dict[str, float]:
        return {"p50_ms": round(1000 * statistics.median(xs), 3), "p99_ms": round(1000 * _pct(xs, 0.99), 3)}

    return {"warm": {"integration": ms(via), "static": ms(direct)}, "cold": cold_report,
            "litellm_version": _litellm_version()}


def _litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")
