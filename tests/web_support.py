"""Helpers for the web tests: a small catalog of real safetensors files, a Context on the test Redis,
and a simulated fleet published with the worker's own heartbeat function (real Redis state, no worker).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import redis
import requests
from safetensors.numpy import save_file

from prewarm import state
from prewarm.config import Settings
from prewarm.context import Context

MIB = 1024 * 1024


def make_catalog(root: Path, models: dict[str, int] | None = None,
                 extra_versions: dict[str, list[str]] | None = None) -> Path:
    """models: id -> size in MiB; extra_versions: id -> later versions (rollout candidates)."""
    models = models or {"alpha": 1, "beta": 2, "gamma": 4}
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for model_id, mib in models.items():
        for version in ["v1", *(extra_versions or {}).get(model_id, [])]:
            name = f"{model_id}-{version}.safetensors"
            save_file({"w": np.zeros((mib * MIB // 4,), dtype=np.float32)}, str(root / name))
            # The builder only has to be importable here: these tests never load a model.
            lines += ["[[models]]", f'id = "{model_id}"', f'version = "{version}"', f'weights = "{name}"',
                      'builder = "json:loads"', "[[models.warmup]]", "shape = [1, 4]", ""]
    path = root / "catalog.toml"
    path.write_text("\n".join(lines))
    return path


def make_context(redis_url: str, catalog: Path, *, hook_token: str | None = None,
                 admin_token: str | None = None, data_dir: Path | None = None, link_wait: bool = True) -> Context:
    """`link_wait=False`: PREWARM_LINK_WAIT=0, the route hook's on-demand load may share a busy link (with it on, the
    default, it leaves a busy link to the scheduler, and none runs beside a bare app)."""
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_NODE": "test-node",
           "PREWARM_DATA_DIR": str(data_dir or catalog.parent), "PREWARM_LINK_WAIT": "1" if link_wait else "0"}
    if hook_token:
        env["PREWARM_HOOK_TOKEN"] = hook_token
    if admin_token:
        env["PREWARM_ADMIN_TOKEN"] = admin_token
    return Context(Settings.from_env(env), start_redis=False)


def publish_gpu(r: redis.Redis, gid: str, *, total_mib: int = 64, replicas: list[state.Replica] | None = None,
                ttl: float = 30.0, heartbeat_seconds: float = 0.0, beat_age_s: float = 0.0) -> state.Gpu:
    """Announce a GPU as its worker would; used bytes are what the replicas hold. `heartbeat_seconds`: the
    beat period the record gives (0: none, freshness judged by the TTL alone); `beat_age_s`: how long ago
    the record says it beat (its key lives `ttl` from now all the same)."""
    node, _, device = gid.partition("/")
    reps = replicas or []
    used = sum(x.bytes for x in reps)
    g = state.Gpu(id=gid, node=node, device=device, queue=state.queue_name(node, device),
                  total_bytes=total_mib * MIB, used_bytes=used, free_bytes=total_mib * MIB - used,
                  last_heartbeat=time.time() - beat_age_s, worker="fake-worker", started_at=time.time(), kind="cpu",
                  heartbeat_seconds=heartbeat_seconds)
    state.write_heartbeat(r, g, reps, ttl)
    return g


def replica(model: str, gid: str, st: str = "ready", *, mib: int = 1, version: str = "v1",
            since: float | None = None, progress: float | None = None) -> state.Replica:
    now = time.time()
    return state.Replica(model=model, version=version, gpu=gid, state=st, bytes=mib * MIB,
                         total_bytes=mib * MIB, progress=1.0 if progress is None else progress,
                         since=now if since is None else since, created_at=now - 1)


def queued_tasks(r: redis.Redis, queue: str) -> list[dict]:
    """Celery messages waiting in a GPU's queue (the Redis transport keeps a list per queue)."""
    import json

    return [json.loads(raw) for raw in r.lrange(queue, 0, -1)]


class WebProc:
    """A real `prewarm web` (gunicorn) on a free loopback port, for tests that need HTTP."""

    def __init__(self, redis_url: str, catalog: Path, work: Path, *, workers: int = 2,
                 env: dict[str, str] | None = None, port: int | None = None) -> None:
        import os
        import subprocess
        import sys

        from prewarm.redis_server import free_port

        repo = Path(__file__).resolve().parent.parent
        self.port = port or free_port()  # a given port: e.g. one a client was pointed at before web was up
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = work / f"web-{self.port}.log"
        self.multiproc_dir = work / f"prom-{self.port}"
        self.multiproc_dir.mkdir(parents=True, exist_ok=True)
        e = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        e.update({"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PORT": str(self.port),
                  "PREWARM_DATA_DIR": str(work / "web-data"), "PROMETHEUS_MULTIPROC_DIR": str(self.multiproc_dir),
                  "PYTHONPATH": str(repo), **(env or {})})
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "prewarm.programs.cli", "web", "--host", "127.0.0.1", "--workers", str(workers)],
                env=e, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=repo,
                start_new_session=True)
        deadline = time.time() + 60
        while True:
            try:
                if self.get("/healthz")[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise AssertionError(f"prewarm web did not come up:\n{self.log()[-4000:]}")
            time.sleep(0.2)

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class HookTraffic:
    """Keeps reporting requests for one model to /hooks/requests every `every` seconds, as a router under
    steady load would; keeps going while web or Redis is down, as a router does."""

    def __init__(self, url: str, model: str, every: float = 0.3) -> None:
        self.url, self.model, self.every = url, model, every
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            try:
                requests.post(f"{self.url}/hooks/requests", json={"model": self.model, "count": 2}, timeout=5)
            except requests.RequestException:
                pass
            self.stop_flag.wait(self.every)

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(10)
