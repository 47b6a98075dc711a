"""`prewarm bench load` at a tiny size, run for real (it writes a model, loads it several ways, reports): in
the system tier because it measures, and measuring is slow on a loaded machine."""

from __future__ import annotations

import pytest

from gpu_worker.loader import load_weights
from prewarm.safetensors_header import read_header
from tests.unit.test_loader import CPU, assert_same


def test_bench_writes_a_valid_model_and_reports_the_agreed_keys(tmp_path):
    """`prewarm bench load` at a tiny size: the generated file is real safetensors and the JSON
    keeps the worker issue's keys (figures are not checked: it reports, it does not assert)."""
    from safetensors.torch import load_file

    from bench import load as bench

    path = tmp_path / "m.safetensors"
    data_bytes = bench.write_model(path, 4 << 20, seed=3)
    assert read_header(path).data_bytes == data_bytes
    assert_same(load_weights(path, CPU), load_file(path))

    r = bench.run_bench(4 << 20, runs=1, directory=str(tmp_path), device="cpu", idle_seconds=0.1)
    for key in ("loader_gib_s", "raw_read_gib_s", "load_file_gib_s", "ratio_to_raw_read", "ratio_to_load_file",
                "peak_rss_bytes", "cold_loader_gib_s", "promote_gib_s"):
        assert isinstance(r[key], int | float) and r[key] > 0, key
    assert r["ratio_to_raw_read"] == pytest.approx(r["loader_gib_s"] / r["raw_read_gib_s"], rel=0.05, abs=0.01)
    # Beside the load into new memory, the load into pre-faulted device memory (a GPU load's analogue).
    for key in ("loader_prefaulted_gib_s", "prefaulted_memcpy_gib_s", "prefaulted_ratio_to_raw_read",
                "idle_loader_gib_s", "idle_loader_prefaulted_gib_s"):
        assert isinstance(r[key], int | float) and r[key] > 0, key
    assert r["prefaulted_ratio_to_raw_read"] == pytest.approx(
        r["loader_prefaulted_gib_s"] / r["raw_read_gib_s"], rel=0.05, abs=0.01)
    assert list(tmp_path.glob("prewarm-bench-*")) == []  # its temp dir is gone
    assert "loader / raw read" in bench.fmt_report(r) and "pre-faulted / raw read" in bench.fmt_report(r)
