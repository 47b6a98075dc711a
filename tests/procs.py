"""Start real `prewarm worker` processes for integration tests (worker, web, scheduler tests reuse this).

    from tests.procs import start_worker
    from tests import procs; worker_factory = procs.worker_factory  # a pytest fixture, in a test module

    w = start_worker(redis_url, catalog, devices="cpu:0=1GiB,cpu:1=1GiB", node="node-a")
    w.gpu_ids            # ["node-a/cpu:0", "node-a/cpu:1"], each heartbeating when start_worker returns
    w.stop()             # SIGTERM: warm shutdown, GPUs removed from the fleet at once
    w.kill()             # SIGKILL: GPUs drop out when the heartbeat TTL lapses
    w.log()              # everything the process printed (also attached to failures by wait_for)

    def test_x(redis_url, worker_factory):  # stops every worker it started at teardown
        w = worker_factory(catalog, devices="cpu:0=64MiB")

Workers get a short heartbeat (0.5 s, TTL 3 s) unless told otherwise, a private PREWARM_DATA_DIR, and the
repository on PYTHONPATH (so builders defined in tests/ import in the worker too).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from prewarm import keys, state
from prewarm.runtime import connect  # redis://, rediss:// and sentinel:// alike

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout: float = 30.0, *, interval: float = 0.05, what: str = "condition",
              log: Callable[[], str] | None = None) -> T:
    """Poll `cond` until it returns something truthy; fail the test (with the worker's log) on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = f"\n--- worker log (tail) ---\n{log()[-4000:]}" if log else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
        time.sleep(interval)


@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    redis_url: str
    node: str
    devices: list[str]
    log_path: Path
    env: dict[str, str] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def gpu_ids(self) -> list[str]:
        return [state.gpu_id(self.node, d) for d in self.devices]

    @property
    def queues(self) -> dict[str, str]:
        """GPU id -> its Celery queue."""
        return {state.gpu_id(self.node, d): state.queue_name(self.node, d) for d in self.devices}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def heartbeating(self) -> bool:
        """Every GPU of this worker announced by this very process."""
        r = connect(self.redis_url)
        try:
            for gid in self.gpu_ids:
                owner = r.hget(keys.gpu(gid), "worker")
                if owner is None or not owner.decode().startswith(f"{self.node}:{self.pid}:"):
                    return False
            return True
        finally:
            r.close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (a warm shutdown finishes running tasks); SIGKILL if it overstays."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> int:
        if self.alive():
            self.proc.kill()
        return self.proc.wait()


# the data folders worker_env made (each worker's health file and log): kept while the session runs, for a failing
# test's log; removed at its end (tests/conftest.py). A full ./test left about 65 of them in /tmp.
MADE_DIRS: list[str] = []


def _data_dir() -> str:
    d = tempfile.mkdtemp(prefix="prewarm-worker-")
    MADE_DIRS.append(d)
    return d


def remove_made_dirs() -> None:
    while MADE_DIRS:
        shutil.rmtree(MADE_DIRS.pop(), ignore_errors=True)


def worker_env(redis_url: str, catalog: Path | str, devices: str, node: str, *, heartbeat_seconds: float = 0.5,
               heartbeat_ttl: float = 3.0, data_dir: Path | None = None,
               env: dict[str, str] | None = None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    e.update({
        "PREWARM_REDIS_URL": redis_url,
        "PREWARM_CATALOG": str(catalog),
        "PREWARM_DEVICES": devices,
        "PREWARM_NODE": node,
        "PREWARM_HEARTBEAT_SECONDS": str(heartbeat_seconds),
        "PREWARM_HEARTBEAT_TTL": str(heartbeat_ttl),
        "PREWARM_DATA_DIR": str(data_dir or _data_dir()),
        "PREWARM_LOAD_THREADS": "2",  # the test machine has 2 cores, shared
        "PREWARM_WARMUP_MAX_PASSES": "4",  # a busy box is rarely "stable": bound warmup tightly in tests
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
    })
    e.update(env or {})
    return e


def start_worker(redis_url: str, catalog: Path | str, devices: str = "cpu:0=1GiB,cpu:1=1GiB",
                 node: str = "node-a", env: dict[str, str] | None = None, *, heartbeat_seconds: float = 0.5,
                 heartbeat_ttl: float = 3.0, threads: int | None = None, timeout: float = 90.0,
                 log_dir: Path | None = None, wait: bool = True) -> WorkerProc:
    """Start `prewarm worker` and (with `wait`) return once every one of its GPUs heartbeats."""
    e = worker_env(redis_url, catalog, devices, node, heartbeat_seconds=heartbeat_seconds,
                   heartbeat_ttl=heartbeat_ttl, env=env)
    log_dir = Path(log_dir or e["PREWARM_DATA_DIR"])
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"worker-{node}-{time.time_ns()}.log"
    cmd = [sys.executable, "-m", "prewarm.programs.cli", "worker", "--loglevel", "INFO"]
    if threads:
        cmd += ["--threads", str(threads)]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=str(REPO), env=e, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    w = WorkerProc(proc, redis_url, node, [d.split("=")[0].strip() for d in devices.split(",") if d.strip()],
                   log_path, e)
    if wait:
        try:
            wait_for(lambda: w.heartbeating() or (not w.alive() and _raise_dead(w)), timeout,
                     what=f"worker {node} ({devices}) to heartbeat", log=w.log)
        except BaseException:
            w.kill()
            raise
    return w


def _raise_dead(w: WorkerProc) -> bool:
    raise AssertionError(f"worker {w.node} exited with {w.proc.returncode} before heartbeating:\n{w.log()[-4000:]}")


def gpu_gone(redis_url: str, gpu: str) -> bool:
    """The GPU is out of the fleet: no live inventory (its heartbeat expired or it was removed)."""
    r = connect(redis_url)
    try:
        return not r.exists(keys.gpu(gpu))
    finally:
        r.close()


@pytest.fixture
def worker_factory(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProc]]:
    """`worker_factory(catalog, devices=..., node=..., env=..., **kw)`: a started worker, stopped at teardown."""
    started: list[WorkerProc] = []

    def start(catalog: Path | str, devices: str = "cpu:0=1GiB,cpu:1=1GiB", node: str = "node-a",
              env: dict[str, str] | None = None, **kw: Any) -> WorkerProc:
        kw.setdefault("log_dir", tmp_path / "worker-logs")
        w = start_worker(redis_url, catalog, devices, node, env, **kw)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop(timeout=15)
