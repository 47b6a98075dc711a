"""The vllm demo model under `prewarm bench engine`: a real engine process's cold start, split.

Needs the engine's environment (`prewarm engines install vllm`); without it this test skips and says so.
One engine start: tens of seconds on two cores. No timing is asserted: only what is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_worker import demo_models as dm
from prewarm.engines import vllm_python, vllm_venv
from tests.procs import REPO

pytestmark = pytest.mark.skipif(
    vllm_python() is None,
    reason=f"the vLLM engine is not installed at {vllm_venv()}: run `prewarm engines install vllm`")


def test_bench_engine_on_the_vllm_demo_model(tmp_path: Path) -> None:
    catalog = dm.write_demo(tmp_path / "d", small=True)  # the engine is installed: the vllm model is in
    out = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "bench", "engine", "tiny-llama-vllm",
                          "--catalog", str(catalog), "--requests", "2", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["runtime"] == "vllm" and r["mode"].startswith("engine process") and not r["primed"]
    c = r["cold_start"]
    assert c["process_start_seconds"] > 0 and c["weight_load_seconds"] > 0 and c["warmup_seconds"] > 0
    assert c["engine_log"]["weights_seconds"] is not None and c["engine_log"]["engine_init_seconds"] is not None
    assert r["host_promotion"] is None and "not supported" in r["host_tier"]
    # The engine's process tree, measured: far more than its weights (the engine's runtime, the KV cache).
    # More than the weights and KV cache it was asked for: the engine's own processes (what the catalog's
    # engine_bytes stands for).
    from prewarm.engines import DEFAULT_VLLM_ENGINE_BYTES
    assert r["held_bytes"] > r["size_bytes"] - DEFAULT_VLLM_ENGINE_BYTES
