"""`prewarm bench router` and `python -m bench.router`: parse the options, run, print.

Nothing here imports LiteLLM at import time (the `prewarm` command's registrars must start fast)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench.term import sigterm_unwinds


def fmt_report(r: dict[str, Any]) -> str:
    w, c = r["warm"], r["cold"]
    i, s = w["integration"], w["static"]
    ratio = i["p50_ms"] / s["p50_ms"] if s["p50_ms"] else float("nan")
    return "\n".join([
        f"LiteLLM {r['litellm_version']}, warm chat completions (ms)    p50      p99",
        f"  with prewarm's routing strategy          {i['p50_ms']:8.3f} {i['p99_ms']:8.3f}",
        f"  static model_list, same replica          {s['p50_ms']:8.3f} {s['p99_ms']:8.3f}",
        f"  integration / static at p50: {ratio:.3f}x",
        f"cold: {c['requests']} requests, {c['failed']} failed, {c['served_by_fallback']} served by the fallback; "
        f"waited p50 {c['wait_seconds']['p50']} s, max {c['wait_seconds']['max']} s "
        f"(prewarm's ETA {c['eta_seconds']} s)"])


def cmd_bench_router(args: argparse.Namespace) -> int:
    from .run import BenchError, run_bench

    log = (lambda m: print(m, file=sys.stderr)) if not args.json else (lambda _m: None)
    try:
        with sigterm_unwinds():  # a SIGTERM stops the embedded Redis and the stand-ins too (bench/term.py)
            r = run_bench(args.requests, args.cold_requests, args.cold_seconds, log=log)
    except BenchError as exc:
        print(f"prewarm bench router: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(r, sort_keys=True) if args.json else fmt_report(r))
    return 0


def add_router_parser(group: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = group.add_parser("router", help="warm-request latency through LiteLLM with prewarm's routing strategy "
                                        "against a static model_list, and a model going cold and coming back")
    p.add_argument("--requests", type=int, default=200, help="warm requests through each router (default 200)")
    p.add_argument("--cold-requests", type=int, default=20,
                   help="requests sent while the model is cold (default 20), then one once it is back")
    p.add_argument("--cold-seconds", type=float, default=3.0, help="how long the model stays cold (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_router)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench router` to the `bench` group."""
    from prewarm.commands import subgroup

    add_router_parser(subgroup(subparsers, "bench", "benchmarks"))


def main(argv: list[str] | None = None) -> int:
    from prewarm.commands import standalone_main

    return standalone_main("python -m bench.router", add_router_parser, argv)
