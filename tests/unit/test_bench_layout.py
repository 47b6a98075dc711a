"""The benchmarks live in bench/ (an installed package), apart from the worker and the tests."""

from __future__ import annotations

import ast
from pathlib import Path

from prewarm.programs.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_benchmarks_do_not_import_the_tests() -> None:
    bad = []
    for p in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            bad += [f"{p.relative_to(ROOT)}: {n}" for n in names if n == "tests" or n.startswith("tests.")]
    assert bad == []


def test_prewarm_bench_load_is_the_bench_package() -> None:
    from bench.load import cmd_bench_load

    args = build_parser().parse_args(["bench", "load", "--size", "1MiB", "--no-cold", "--idle", "0"])
    assert args.func is cmd_bench_load and args.size == 1 << 20 and args.no_cold and args.idle == 0


def test_prewarm_bench_failover_is_the_bench_package() -> None:
    from bench.failover import cmd_bench_failover

    args = build_parser().parse_args(["bench", "failover", "--json"])
    assert args.func is cmd_bench_failover and args.failovers == 5 and args.json
