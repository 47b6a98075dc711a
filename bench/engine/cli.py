"""`prewarm bench engine` and `python -m bench.engine`: parse the options, run, print.

Nothing here imports torch at import time (the `prewarm` command's registrars must start fast)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench.term import sigterm_unwinds


def _s(x: float | None) -> str:
    return "      -" if x is None else f"{x:7.3f}"


def fmt_report(r: dict[str, Any]) -> str:
    c, w = r["cold_start"], r["warm_request"]
    rows = [f"{r['model']} ({r['runtime']}, {r['mode']}{', primed' if r['primed'] else ''}), "
            f"{r['held_bytes'] / 1e6:.1f} MB held on {r['device']}",
            "                      seconds",
            f"cold start (total)    {_s(c['total_seconds'])}",
            f"  process start       {_s(c['process_start_seconds'])}",
            f"  weight load         {_s(c['weight_load_seconds'])}"
            + ("   (spawn -> /health: the engine's imports, processes, weights, init)" if "engine_log" in c else ""),
            *([f"    weights (its log) {_s(c['engine_log']['weights_seconds'])}",
               f"    init (its log)    {_s(c['engine_log']['engine_init_seconds'])}   (profile, KV cache, "
               "compile)"]
              if "engine_log" in c else []),
            f"  warmup              {_s(c['warmup_seconds'])}",
            f"warm request (p50)    {_s(w['p50_seconds'])}   ({w['requests']} requests)"]
    h = r["host_promotion"]
    if h is None:
        rows.append(f"host tier             {r['host_tier']}")
    else:
        engine = h.get("tier", "").startswith("engine sleep")
        rows += [f"host stage            {_s(h['stage_seconds'])}   "
                 + ("(the warm engine to sleep level 1: weights to host)" if engine
                    else "(storage -> node host cache, once)"),
                 f"promotion (total)     {_s(h['total_seconds'])}",
                 f"  promote             {_s(h['weight_load_seconds'])}" + ("   (wake_up)" if engine else ""),
                 f"  warmup              {_s(h['warmup_seconds'])}"]
    rows.append(f"cold start / warm request: {c['total_seconds'] / max(w['p50_seconds'], 1e-9):,.0f}x")
    return "\n".join(rows)


def fmt_adapter_report(r: dict[str, Any]) -> str:
    c, b, w = r["cold_start"], r["base"]["cold_start"], r["warm_request"]
    rows = [f"{r['model']} ({r['runtime']}: a LoRA adapter of {r['base']['model']}), "
            f"{r['held_bytes'] / 1e6:.2f} MB held on {r['device']}",
            "                          seconds",
            f"base engine cold start    {_s(r['base_cold_start_seconds'])}   (start -> ready, LoRA enabled)",
            f"  process start           {_s(b['process_start_seconds'])}",
            f"  weight load             {_s(b['weight_load_seconds'])}",
            f"  warmup                  {_s(b['warmup_seconds'])}",
            f"adapter load (total)      {_s(r['adapter_load_seconds'])}   (absent -> ready in the running engine)",
            f"  load_lora_adapter       {_s(c['weight_load_seconds'])}",
            f"  warmup                  {_s(c['warmup_seconds'])}",
            f"warm request (p50)        {_s(w['p50_seconds'])}   ({w['requests']} requests, served as "
            f"{r['served_model']!r})",
            f"processes started by the adapter load: {r['processes_started_by_adapter_load']}",
            f"base cold start / adapter load: {r['base_cold_start_seconds'] / max(r['adapter_load_seconds'], 1e-9):,.0f}x"]
    return "\n".join(rows)


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from prewarm.catalog import load_catalog
    from prewarm.catalog_entries import CatalogError
    from prewarm.config import Settings

    try:
        catalog = load_catalog(args.catalog or Settings.from_env().catalog)
        model, _, version = args.model.partition("@")
        entry = catalog.get(model, version or None)
        base = catalog.get(entry.base) if entry.is_adapter else None
    except (CatalogError, KeyError, OSError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"prewarm bench engine: {msg}", file=sys.stderr)
        return 2
    from .run import BenchError, run_adapter_bench, run_bench

    log = (lambda m: print(m, file=sys.stderr)) if not args.json else (lambda _m: None)
    try:
        with sigterm_unwinds():  # a SIGTERM stops the engine it started too (bench/term.py)
            if base is not None:
                r = run_adapter_bench(entry, base, device=args.device, requests=args.requests, log=log)
            else:
                r = run_bench(entry, device=args.device, requests=args.requests, log=log)
    except BenchError as exc:
        print(f"prewarm bench engine: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(r, sort_keys=True) if args.json else fmt_adapter_report(r) if base is not None
          else fmt_report(r))
    return 0


def add_engine_parser(group: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = group.add_parser("engine", help="a replica's cold start (process start, weight load, warmup) against "
                                        "a warm request, and a host-tier promotion where there is one; for a "
                                        "LoRA adapter, its load into a running base engine beside the base "
                                        "engine's cold start")
    p.add_argument("model", metavar="MODEL", help="catalog model id or id@version")
    p.add_argument("--catalog", help="catalog file (default PREWARM_CATALOG, else the demo catalog)")
    p.add_argument("--device", default="cpu", help="torch device the replica runs on (default cpu)")
    p.add_argument("--requests", type=int, default=5, help="warm requests, their median reported (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_engine)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench engine` to the `bench` group `bench load` made."""
    from prewarm.commands import subgroup

    add_engine_parser(subgroup(subparsers, "bench", "benchmarks"))


def main(argv: list[str] | None = None) -> int:
    from prewarm.commands import standalone_main

    return standalone_main("python -m bench.engine", add_engine_parser, argv)
