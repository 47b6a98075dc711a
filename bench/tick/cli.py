"""`prewarm bench tick` and `python -m bench.tick`: parse the options, run, print."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench.term import sigterm_unwinds
from prewarm import arg_types

from .run import GPU_MEMORY, run_bench


def fmt_report(r: dict[str, Any]) -> str:
    s = r["settings"]
    ms = lambda d: f"p50 {d['p50'] * 1000:7.1f} ms   p95 {d['p95'] * 1000:7.1f} ms"  # noqa: E731
    return "\n".join([
        f"{s['models']:,} models x {s['gpus']} GPUs ({s['replicas']:,} replicas), {s['ticks']} ticks every "
        f"{s['interval']:g} s, policy {s['policy']}",
        f"first tick   {r['first_tick_seconds'] * 1000:7.1f} ms   (snapshot "
        f"{r['first_tick']['snapshot_seconds'] * 1000:.1f}, plan {r['first_tick']['plan_seconds'] * 1000:.1f}, "
        f"dispatch {r['first_tick']['dispatch_seconds'] * 1000:.1f})",
        f"tick         {ms(r['tick_seconds'])}",
        f"  snapshot   {ms(r['snapshot_seconds'])}",
        f"  plan       {ms(r['plan_seconds'])}",
        f"  dispatch   {ms(r['dispatch_seconds'])}",
        f"cpu p50      snapshot {r['cpu_seconds']['snapshot']['p50'] * 1000:.1f} ms, plan "
        f"{r['cpu_seconds']['plan']['p50'] * 1000:.1f} ms, dispatch {r['cpu_seconds']['dispatch']['p50'] * 1000:.1f} ms "
        f"(this process); Redis {r['cpu_seconds']['redis']['p50'] * 1000:.1f} ms",
        f"round trips  p50 {r['round_trips']['p50']:g}   p95 {r['round_trips']['p95']:g};  actions p50 "
        f"{r['actions']['p50']:g}   p95 {r['actions']['p95']:g}",
        f"redis        {r['redis_bytes'] / 1024**2:.1f} MiB",
    ])


def cmd_bench_tick(args: argparse.Namespace) -> int:
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else (lambda _m: None)
    try:
        with sigterm_unwinds():  # a SIGTERM stops the embedded Redis too (bench/term.py)
            r = run_bench(args.models, args.gpus, args.ticks, gpu_memory=args.gpu_memory, rate=args.rate,
                          zipf=args.zipf, interval=args.interval, seed=args.seed, worker=not args.no_worker,
                          log=log)
    except (ValueError, RuntimeError) as exc:
        print(f"prewarm bench tick: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(r, sort_keys=True) if args.json else fmt_report(r))
    return 0


def add_tick_parser(group: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = group.add_parser("tick", help="the live scheduler's tick against a Redis filled like a large fleet")
    p.add_argument("--models", type=int, default=10_000, help="catalog models (default 10000)")
    p.add_argument("--gpus", type=int, default=256, help="GPUs, 8 per node (default 256)")
    p.add_argument("--ticks", type=int, default=15, help="ticks to run, the first reported apart (default 15)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--gpu-memory", type=arg_types.size_at_least(1), default=GPU_MEMORY, help="per GPU (default 80GiB)")
    p.add_argument("--rate", type=float, default=300.0, help="requests per second over all models (300)")
    p.add_argument("--zipf", type=float, default=1.1, help="popularity skew (default 1.1)")
    p.add_argument("--interval", type=float, default=None,
                   help="seconds from one tick's start to the next (default PREWARM_TICK_SECONDS, 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-worker", action="store_true",
                   help="nobody does the tasks the scheduler sends (by default the bench's workers take them "
                        "between ticks: evicts at once, preloads after their load time)")
    p.set_defaults(func=cmd_bench_tick)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench tick` to the `bench` group `bench load` made (prewarm/cli.py registers bench.load first)."""
    from prewarm.commands import subgroup

    add_tick_parser(subgroup(subparsers, "bench", "benchmarks"))


def main(argv: list[str] | None = None) -> int:
    from prewarm.commands import standalone_main

    return standalone_main("python -m bench.tick", add_tick_parser, argv)
