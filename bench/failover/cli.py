"""`prewarm bench failover` and `python -m bench.failover`: parse the options, run, print."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench.term import sigterm_unwinds

from .run import run_bench


def fmt_report(r: dict[str, Any]) -> str:
    h, p = r["hooks"], r["preloads"]
    lines = [
        f"{r['failovers']} failovers (kill -9 of the master; {r['settings']['replicas']} replicas, 3 sentinels)",
        f"election       {', '.join(f'{s:.2f}' for s in r['election_seconds'])} s",
        f"fleet whole    {', '.join(f'{s:.2f}' for s in r['fleet_whole_seconds'])} s after the kill",
        f"leaders        {r['leaders_after_failover']} after each failover (goal: exactly 1)",
        f"worker         {r['worker_restarts']} restarts (goal 0), {r['consumer_restarts']} consumer restarts",
        f"hooks          {h['answered_202']} answered 202, {h['recorded']} recorded, {h['lost']} lost "
        f"({h['answered_503']} answered 503 and resent)",
        f"preloads       {p['sent']} sent, {p['completed']} completed, {p['resent_after_failover']} sent again "
        f"after a failover, {p['lost']} lost",
    ]
    lines += [f"  lost: {d}" for d in p["lost_detail"]]
    if r.get("logs"):
        lines.append(f"logs kept in {r['logs']}")
    return "\n".join(lines)


def cmd_bench_failover(args: argparse.Namespace) -> int:
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else (lambda _m: None)
    try:
        with sigterm_unwinds():  # a SIGTERM stops the Sentinel cluster and the fleet too (bench/term.py)
            r = run_bench(args.failovers, preload_pairs=args.preload_pairs, hook_threads=args.hook_threads,
                          settle=args.settle, log=log)
    except (ValueError, RuntimeError, TimeoutError) as exc:
        print(f"prewarm bench failover: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(r, sort_keys=True) if args.json else fmt_report(r))
    return 0


def add_failover_parser(group: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = group.add_parser("failover", help="Sentinel failovers of a loopback Redis under hook traffic and preloads")
    p.add_argument("--failovers", type=int, default=5, help="kill -9 of the master this many times (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--preload-pairs", type=int, default=4,
                   help="(model, GPU) pairs each preloaded, then evicted, over and over (default 4)")
    p.add_argument("--hook-threads", type=int, default=2, help="threads posting hook events (default 2)")
    p.add_argument("--settle", type=float, default=4.0, help="seconds of traffic between failovers (default 4)")
    p.set_defaults(func=cmd_bench_failover)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    from prewarm.commands import subgroup

    add_failover_parser(subgroup(subparsers, "bench", "benchmarks"))


def main(argv: list[str] | None = None) -> int:
    from prewarm.commands import standalone_main

    return standalone_main("python -m bench.failover", add_failover_parser, argv)
