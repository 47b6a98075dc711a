"""`prewarm bench engine`: the figures' keys for the torch and transformers demo models (real files, the
runtimes in this process), and its errors. No timing is asserted: only what is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_worker import demo_models as dm
from prewarm.programs.cli import build_parser, main

COLD_KEYS = {"total_seconds", "process_start_seconds", "weight_load_seconds", "warmup_seconds"}


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dm.write_demo(tmp_path_factory.mktemp("bench-engine") / "d", small=True, vllm=False)


def _bench(catalog: Path, model: str, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["bench", "engine", model, "--catalog", str(catalog), "--requests", "2", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bench_engine_is_the_bench_package() -> None:
    from bench.engine import cmd_bench_engine

    args = build_parser().parse_args(["bench", "engine", "tiny-llama-hf", "--json"])
    assert args.func is cmd_bench_engine and args.model == "tiny-llama-hf" and args.json


def test_transformers_demo_model_reports_cold_start_and_warm_request(catalog: Path, capsys) -> None:  # noqa: ANN001
    r = _bench(catalog, "tiny-llama-hf", capsys)
    assert r["runtime"] == "transformers" and r["model"] == "tiny-llama-hf@v1" and r["mode"] == "in-process"
    assert set(r["cold_start"]) == COLD_KEYS and r["cold_start"]["process_start_seconds"] == 0.0
    assert r["warm_request"]["requests"] == 2 and r["warm_request"]["p50_seconds"] > 0
    assert r["held_bytes"] >= r["size_bytes"] > 0
    assert r["host_promotion"] is None and r["host_tier"].startswith("none")


def test_torch_demo_model_reports_a_host_tier_promotion(catalog: Path, capsys) -> None:  # noqa: ANN001
    r = _bench(catalog, "tiny-lm@v2", capsys)
    assert r["runtime"] == "torch" and r["model"] == "tiny-lm@v2"
    assert set(r["host_promotion"]) == COLD_KEYS | {"stage_seconds", "tier"}
    assert r["host_tier"] == "node host cache"


def test_bench_engine_table_and_unknown_model(catalog: Path, capsys) -> None:  # noqa: ANN001
    assert main(["bench", "engine", "tiny-mlp", "--catalog", str(catalog), "--requests", "1"]) == 0
    out = capsys.readouterr().out
    assert "cold start (total)" in out and "warm request (p50)" in out and "promotion (total)" in out
    assert main(["bench", "engine", "no-such-model", "--catalog", str(catalog)]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_engine_log_figures_read_vllms_own_lines() -> None:
    from bench.engine.run import engine_log_figures

    text = ("(Worker pid=8684) INFO 12-01 11:19:56 [default_loader.py:501] Loading weights took 0.01 seconds\n"
            "(EngineCore pid=8520) INFO 12-01 11:20:27 [core.py:402] init engine (profile, create kv cache, "
            "warmup model) took 30.72 s\n")
    assert engine_log_figures(text) == {"weights_seconds": 0.01, "engine_init_seconds": 30.72}
    assert engine_log_figures("another version's wording") == {"weights_seconds": None, "engine_init_seconds": None}
