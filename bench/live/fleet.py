"""A fresh fleet on this machine for one policy: embedded Redis, web, a worker with CPU virtual GPUs and a
scheduler, each a real process (`prewarm web|worker|scheduler`); `stop()` ends every one of them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import requests

from prewarm import keys, state
from prewarm.config import Settings, repo_root
from prewarm.context import Context
from prewarm.domain import states as rs
from prewarm.redis_server import EmbeddedRedis, free_port


class Fleet:
    def __init__(self, catalog: Path, devices: str, policy: str, log=print) -> None:  # noqa: ANN001
        self.work = Path(tempfile.mkdtemp(prefix="prewarm-bench-live-"))
        self.log = log
        self.redis = EmbeddedRedis().start()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        self.env.update({"PREWARM_REDIS_URL": self.redis.url, "PREWARM_CATALOG": str(catalog),
                         "PREWARM_DEVICES": devices, "PREWARM_NODE": "bench", "PORT": str(self.port),
                         "PREWARM_DATA_DIR": str(self.work), "PREWARM_POLICY": policy,
                         "PROMETHEUS_MULTIPROC_DIR": str(self.work / "prom"), "PYTHONUNBUFFERED": "1",
                         # no host-memory tier: the simulator beside it runs without one (as the baselines)
                         "PREWARM_HOST_CACHE": "0",
                         "PYTHONPATH": str(repo_root())})
        (self.work / "prom").mkdir()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ctx = Context(Settings.from_env(self.env), start_redis=False)
        self.r: redis.Redis = self.ctx.r

    def _start(self, name: str, *args: str) -> None:
        with open(self.work / f"{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", *args], env=self.env,
                                                cwd=repo_root(), stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def tail(self, name: str, n: int = 3000) -> str:
        p = self.work / f"{name}.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    def _wait(self, what: str, cond, timeout: float, proc: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while not cond():
            if self.procs[proc].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bench live: {what} did not happen within {timeout:g} s; {proc} log:\n"
                                   f"{self.tail(proc)}")
            time.sleep(0.2)

    def start_web_and_worker(self, n_gpus: int) -> None:
        self._start("web", "web", "--host", "127.0.0.1", "--workers", "2")
        self._start("worker", "worker", "--loglevel", "WARNING")

        def web_up() -> bool:
            try:
                return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        self._wait("web answering /healthz", web_up, 120, "web")
        self._wait(f"{n_gpus} GPUs heartbeating", lambda: len(state.read_fleet(self.r).alive()) >= n_gpus, 180,
                   "worker")

    def start_scheduler(self) -> None:
        self._start("scheduler", "scheduler")
        self._wait("scheduler leadership", lambda: self.r.get(keys.LEADER_LOCK) is not None, 60,
                   "scheduler")

    def measure_loads(self, models: list[str], rounds: int = 1) -> dict[str, list[float]]:
        """Each model, `rounds` times: a cold route lookup (the route hook's on-demand preload), polled as a
        router polls until ready, then evicted. Returns the seconds from the lookup to the ready answer per
        model (the cold path as a router sees it: dispatch, load, warmup, ready published); the worker
        records its own load times meanwhile. Every policy starts with these measured and an empty fleet."""
        out: dict[str, list[float]] = {m: [] for m in models}
        s = requests.Session()
        for _ in range(rounds):
            for m in models:
                out[m].append(self._cold_lookup(s, m))
                entry = self.ctx.catalog.get(m)
                for g in state.read_fleet(self.r).alive():
                    if any(x.model == m for x in g.replicas):
                        self.ctx.dispatcher.evict(m, entry.version, g, actor="operator", kind="bench",
                                                  reason="bench live: load time measured")
                self._wait(f"{m} evicted", lambda m=m: not state.read_fleet(self.r).replicas(m), 60, "worker")
        return out

    def _cold_lookup(self, s: requests.Session, m: str) -> float:
        """Seconds from a cold route lookup of m to its ready answer, polled as a router polls."""
        t0 = time.monotonic()
        retry: dict[str, str] = {}
        while s.get(f"{self.url}/hooks/route", params={"model": m, **retry}, timeout=30).json().get(
                "state") != rs.ROUTE_READY:
            retry = {"retry": "1"}
            if time.monotonic() - t0 > 120:
                raise RuntimeError(f"bench live: {m} not ready 120 s after a cold lookup; worker log:\n"
                                   f"{self.tail('worker')}")
            time.sleep(0.02)
        return time.monotonic() - t0

    def measure_make_room(self, models: list[str], passes: int = 2) -> dict[str, list[float]]:
        """The cold path when memory is full, with the scheduler running: each model in turn, `passes` times
        over the list and nothing evicted by the bench, so once the GPUs are full a cold lookup finds no GPU
        with room: the route hook cannot place the load, the lookup wakes the scheduler, whose policy evicts
        and preloads (a Celery hop each). Returns, per model, the seconds from such a lookup (no GPU had room
        for it) to its ready answer; lookups that found room, or the model ready, are not counted."""
        out: dict[str, list[float]] = {m: [] for m in models}
        s = requests.Session()
        for _ in range(passes):
            for m in models:
                fleet = state.read_fleet(self.r)
                if fleet.replicas(m):
                    continue
                size = self.ctx.catalog.get(m).size_bytes
                full = all(g.free_bytes < size for g in fleet.alive())
                took = self._cold_lookup(s, m)
                if full:
                    out[m].append(took)
        return out

    def stop(self) -> None:
        for name in ("scheduler", "web", "worker"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs.clear()
        self.ctx.r.close()
        self.redis.stop()
        # its logs, data and metrics: a failure's RuntimeError has already quoted the log it needs
        shutil.rmtree(self.work, ignore_errors=True)
