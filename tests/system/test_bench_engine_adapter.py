"""`prewarm bench engine <adapter>` (issue 29, item 6): the base engine started with LoRA enabled, the
adapter loaded into that running engine, a warm request through it. Checks the report's keys, that the
requests were served under the adapter's name by the base's engine, and that loading the adapter started
no process (no second engine). No timing is asserted.

Needs the engine's environment (`prewarm engines install vllm`); without it the test skips and says so.
One engine start (about two minutes on this two-core machine).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine.cli import fmt_adapter_report
from gpu_worker.demo_hf import tiny_llama_config, write_tiny_llama
from gpu_worker.demo_lora import write_lora_adapter
from prewarm.engines import vllm_python, vllm_venv
from prewarm.programs.cli import main

pytestmark = pytest.mark.skipif(
    vllm_python() is None,
    reason=f"the vLLM engine is not installed at {vllm_venv()}: run `prewarm engines install vllm`")

COLD_KEYS = {"total_seconds", "process_start_seconds", "weight_load_seconds", "warmup_seconds"}


def catalog(folder: Path) -> Path:
    """The tiny Llama as a vllm base with one LoRA slot, and one rank-8 adapter of it."""
    folder.mkdir(parents=True)
    write_tiny_llama(folder / "tiny-chat", seed=3)
    write_lora_adapter(folder / "lora-a", tiny_llama_config(), rank=8, seed=1)
    (folder / "catalog.toml").write_text(
        '[[models]]\nid = "tiny-chat"\nversion = "v1"\nruntime = "vllm"\npath = "tiny-chat"\n'
        "max_adapters = 1\nmax_cpu_adapters = 1\nmax_lora_rank = 8\n[[models.warmup]]\nprompt_tokens = 16\n"
        '[[models]]\nid = "lora-a"\nversion = "v1"\nruntime = "vllm-adapter"\nbase = "tiny-chat"\n'
        'path = "lora-a"\nrank = 8\n[[models.warmup]]\nprompt_tokens = 8\n')
    return folder / "catalog.toml"


def test_adapter_bench_reports_the_base_start_and_a_load_into_the_running_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = catalog(tmp_path / "c")
    assert main(["bench", "engine", "lora-a", "--catalog", str(path), "--requests", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["model"] == "lora-a@v1" and r["runtime"] == "vllm-adapter"
    assert set(r["cold_start"]) == COLD_KEYS and r["cold_start"]["process_start_seconds"] == 0.0
    assert r["adapter_load_seconds"] == r["cold_start"]["total_seconds"] > 0
    base = r["base"]
    assert base["model"] == "tiny-chat@v1" and set(base["cold_start"]) == COLD_KEYS
    assert r["base_cold_start_seconds"] == base["cold_start"]["total_seconds"] > 0
    # The adapter was served by the base's own engine, under its own name, and its load started nothing:
    # the engine's process tree was there (seen) and no process joined it.
    assert r["endpoint"] == base["endpoint"] and base["endpoint"].startswith("http://")
    assert r["served_model"] == "lora-a"
    assert base["processes"] >= 1 and r["processes_started_by_adapter_load"] == 0
    assert r["warm_request"]["requests"] == 2 and r["warm_request"]["p50_seconds"] > 0
    assert r["held_bytes"] > 0 and r["host_promotion"] is None
    table = fmt_adapter_report(r)
    assert "base engine cold start" in table and "adapter load (total)" in table
    assert "processes started by the adapter load: 0" in table

