"""The pieces `prewarm bench router` (and the LiteLLM tests) stand a fleet up with: a catalog, a real
`prewarm web`, and ready replicas announced with the worker's own heartbeat record whose endpoints are
OpenAI-compatible stand-ins (bench/router/standin.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any


class BenchError(RuntimeError):
    """The benchmark cannot run (LiteLLM missing, the web did not start); the message says why."""


def catalog(root: Path, model: str, fallback: str) -> Path:
    """A catalog of `model`, whose fallback is `fallback`, and `fallback` (tiny weights: never loaded)."""
    import numpy as np
    from safetensors.numpy import save_file

    lines = []
    for m, extra in ((model, f'fallback = "{fallback}"'), (fallback, "")):
        save_file({"w": np.zeros((256,), dtype=np.float32)}, str(root / f"{m}.safetensors"))
        lines += ["[[models]]", f'id = "{m}"', 'version = "v1"', f'weights = "{m}.safetensors"',
                  'builder = "json:loads"', extra, "[[models.warmup]]", "shape = [1, 4]", ""]
    (root / "catalog.toml").write_text("\n".join(lines))
    return root / "catalog.toml"


class StandinFleet:
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

    def start(self) -> StandinFleet:
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                for gid, reps in self.replicas.items():
                    self._announce(gid, reps)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.r.close()


def start_web(redis_url: str, catalog: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
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
