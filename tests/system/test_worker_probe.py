"""`prewarm probe live|ready` against a real `prewarm worker` (the Kubernetes worker DaemonSet's probes)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from gpu_worker import health
from tests import procs
from tests.model_files import tiny_catalog
from tests.procs import REPO, WorkerProc, wait_for

worker_factory = procs.worker_factory  # the fixture, used by name


def _probe(w: WorkerProc, what: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "probe", what], cwd=str(REPO), env=w.env,
                          capture_output=True, text=True, timeout=60)


def test_probes_follow_the_worker_from_ready_to_stopped(worker_factory: Callable[..., WorkerProc],
                                                        tmp_path: Path) -> None:
    catalog = tiny_catalog(tmp_path / "models", ["tiny-lm"])
    w = worker_factory(catalog, devices="cpu:0=256MiB", node="probe-node")
    # heartbeating: the consumer is connected and the GPUs announced, so the probe says ready
    ready = wait_for(lambda: _probe(w, "ready").returncode == 0 or None, 30, what="probe ready", log=w.log)
    assert ready
    live = _probe(w, "live")
    assert live.returncode == 0, live.stderr
    assert live.stdout.strip() == "prewarm probe live: ok"

    assert w.stop() == 0
    # the last word the stopped worker wrote: stopping (so not ready, however soon or late a probe asks)
    assert health.read(health.path_for(Path(w.env["PREWARM_DATA_DIR"]), w.node)).stopping
    after = _probe(w, "ready")
    assert after.returncode == 1
    assert "stopping" in after.stderr


def test_probe_without_a_worker_says_what_is_missing(tmp_path: Path) -> None:
    env = procs.worker_env("redis://127.0.0.1:1/0", tmp_path / "none.toml", "cpu:0=64MiB", "nobody",
                           data_dir=tmp_path / "data")
    out = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "probe", "live"], cwd=str(REPO), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "worker-nobody.json does not exist" in out.stderr
