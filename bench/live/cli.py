"""`prewarm bench live`: parse the options, run (run.py), print the table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.term import sigterm_unwinds
from prewarm import arg_types
from prewarm.domain.policy_names import LIVE_POLICIES, check

DEFAULT_POLICIES = "prewarm,faascache,on-demand-lru"


def table(out: dict) -> str:
    hdr = (f"{'policy':<17} {'requests':>8} {'cold live':>9} {'cold sim':>9} {'live/sim':>8} "
           f"{'wait p50 live':>13} {'sim':>6} {'p95 live':>9} {'sim':>6}")
    lines = [hdr, "-" * len(hdr)]
    for name, p in out["policies"].items():
        lv, sm = p["live"], p["simulated"]
        ratio = f"{lv['cold_starts'] / sm['cold_starts']:.2f}" if sm["cold_starts"] else "-"
        lines.append(f"{name:<17} {lv['requests']:>8} {lv['cold_starts']:>9} {sm['cold_starts']:>9} {ratio:>8} "
                     f"{lv['wait_seconds']['p50']:>13.2f} {sm['wait_seconds']['p50']:>6.2f} "
                     f"{lv['wait_seconds']['p95']:>9.2f} {sm['wait_seconds']['p95']:>6.2f}")
    return "\n".join(lines)


def cmd_bench_live(args: argparse.Namespace) -> int:
    from prewarm.programs.replay import BUNDLED_TRACE

    from .run import run

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        for p in policies:
            check(p)
    except ValueError as exc:
        print(f"prewarm bench live: --policies: {exc}".replace("PREWARM_POLICY=", ""), file=sys.stderr)
        return 2
    trace = Path(args.trace) if args.trace else BUNDLED_TRACE
    if not trace.is_file():
        print(f"prewarm bench live: --trace {trace}: no such file (an Azure Functions per-minute CSV)",
              file=sys.stderr)
        return 2
    def log(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    with sigterm_unwinds():  # a SIGTERM stops the fleet and its Redis too (bench/term.py)
        out = run(trace, args.minutes, args.speed, policies, n_models=args.models, rate=args.rate, gpus=args.gpus,
                  gpu_mib=args.gpu_mib, seed=args.seed, log=log)
    print(json.dumps(out, indent=1) if args.json else table(out))
    return 0


def add_live_parser(group: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = group.add_parser("live", help="replay a trace through a real fleet once per policy, and the simulator beside it")
    p.add_argument("--trace", help="Azure Functions per-minute CSV (default: the bundled azure2019-500)")
    p.add_argument("--minutes", type=arg_types.positive, default=60.0, help="trace minutes to replay (default 60)")
    p.add_argument("--speed", type=arg_types.positive, default=30.0, help="trace seconds per real second (default 30)")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help=f"comma list of {','.join(LIVE_POLICIES)} (default {DEFAULT_POLICIES})")
    p.add_argument("--models", type=arg_types.whole_at_least(1), default=16, help="the trace's busiest functions to map (default 16)")
    p.add_argument("--rate", type=arg_types.positive, default=8.0, help="about this many requests per real second (default 8)")
    p.add_argument("--gpus", type=arg_types.whole_at_least(1), default=2, help="CPU virtual GPUs of the worker (default 2)")
    p.add_argument("--gpu-mib", type=arg_types.whole_at_least(1), default=None,
                   help="memory per GPU in MiB (default: a third of the catalog over the GPUs)")
    p.add_argument("--seed", type=arg_types.whole_at_least(0), default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_live)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    from prewarm.commands import subgroup

    add_live_parser(subgroup(subparsers, "bench", "benchmarks"))
