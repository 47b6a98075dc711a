"""`prewarm simulate` (argparse registration) and the run/report logic behind it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from prewarm import arg_types
from prewarm.config import parse_idle_memory_budget, parse_max_demand_wait, parse_slo
from prewarm.domain.policy import STALE_RATE_READINGS, PolicyConfig

from .policies import POLICIES
from .run import simulate
from .trace import FORMATS, GIB, GPU_MEMORY, ProfileError, read_trace


def register(subparsers: Any) -> None:
    """Add the `simulate` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "simulate",
        help="replay a request trace through the warming policy and the baselines",
        description="Discrete-event trace replay: cold starts, waits, bytes loaded and GPU "
        "memory-time of each policy on a simulated fleet.",
    )
    add_arguments(p)
    p.set_defaults(func=run_cli)
    from .sweep import register as register_sweep  # `prewarm simulate-sweep` (issue 12)

    register_sweep(subparsers)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="trace file (CSV)")
    p.add_argument("--format", choices=FORMATS, default="azure-minute")
    p.add_argument("--profile", help="CSV model,size_bytes,load_seconds (default: seeded sizes)")
    p.add_argument("--gpus", type=arg_types.whole_at_least(1), default=8)
    p.add_argument("--gpu-memory", type=arg_types.size_at_least(1), default=GPU_MEMORY, help="memory per GPU, e.g. 80GiB")
    p.add_argument("--policies", type=arg_types.names_of(tuple(POLICIES)), default="all",
                   help=f"comma list of {','.join(POLICIES)} or all")
    p.add_argument("--json", dest="json_out", type=arg_types.output_file, help="write the results as JSON here")
    p.add_argument("--plot", type=arg_types.output_file, help="write a PNG: cold-start share against memory-time")
    p.add_argument("--seed", type=int, default=0, help="seed for spreading per-minute counts")
    p.add_argument("--contention", choices=["shared", "none"], default="shared")
    p.add_argument("--host-memory", type=arg_types.size_at_least(0), default="0",
                   help="host-memory staging cache per node (8 GPUs a node), e.g. 256GiB; 0 = no staging tier")
    p.add_argument("--stage-bandwidth", type=arg_types.rate, default="2GiB",
                   help="storage → host cache bandwidth per node, bytes/s (e.g. 2GiB); stages on a node share it")
    p.add_argument("--load-slots", type=int, default=PolicyConfig().max_loads_per_gpu,
                   help="loads one GPU runs at once, for every policy; more queue FIFO with their memory "
                   "reserved, as the worker's pending replicas (default %(default)s, the worker's "
                   "PREWARM_MAX_LOADS_PER_GPU; 0 = every load at once, the old model, for reference)")
    p.add_argument("--idle-memory-budget", default=None,
                   help="prewarm only: share of each GPU that replicas with no expected demand may hold, "
                   "e.g. 0.25 (PREWARM_IDLE_MEMORY_BUDGET; default unlimited: such replicas are evicted "
                   "only when a load needs their memory)")
    p.add_argument("--max-demand-wait", default=None,
                   help="prewarm only: a request waiting this long (e.g. 60s) is served next, before the "
                   "most valuable loads (PREWARM_MAX_DEMAND_WAIT; default off)")
    p.add_argument("--no-regret", choices=["on", "off"], default="on",
                   help="prewarm only: its no-regret layer (PREWARM_NO_REGRET): the expert whose order wins "
                   "the duels of the real evictions, and then proves itself in a trial, orders evictions "
                   "(default on; off: prewarm's own order alone; docs/simulation.md, duels.py)")
    p.add_argument("--link-wait", choices=["on", "off"], default="on",
                   help="prewarm only: a demand load waits for a busy link where that costs fewer cold requests "
                   "than sharing it (PREWARM_LINK_WAIT; default on; docs/simulation.md)")
    p.add_argument("--refute-stale-rate", choices=STALE_RATE_READINGS, default="auto",
                   help="prewarm only: a model whose stream has stopped (a silence implausible at its measured rate) "
                   "is valued by its idle-time model, not by the rate it had (PREWARM_REFUTE_STALE_RATE; default auto: "
                   "while the fleet's record says such silences are mostly stops; docs/simulation.md, \"A stopped "
                   "stream's rate\")")
    p.add_argument("--adapter-slot-replicas", choices=["on", "off"], default="on",
                   help="prewarm only, adapter traces (a profile with a base column): start one more base replica "
                   "in free memory when its adapters expected soon outnumber its replicas' LoRA slots (default on)")
    p.add_argument("--promote-bandwidth", type=arg_types.rate, default=None,
                   help="host cache → GPU bandwidth, bytes/s (e.g. 16GiB) in the default promotion time "
                   "(0.5 s + size / bandwidth + 0.1 s/GiB, at most the load time); default 16GiB")
    p.add_argument("--slo", help="run prewarm with the cold-start SLO steering its speculative budget, as "
                   "PREWARM_COLD_START_SLO: e.g. share=0.05,window=15m or p95=10s")
    p.add_argument("--hours", type=float, help="replay only the first HOURS of the trace")


def table(out: dict) -> str:
    hdr = (f"{'policy':<17} {'requests':>9} {'cold':>8} {'share':>7} {'p75/mdl':>7} {'wait p50':>8} "
           f"{'p95':>7} {'p99':>7} {'wait tot s':>11} {'loads':>7} {'TiB ld':>7} {'idle GiBh':>9} {'tot GiBh':>9} {'/oracle':>7}")
    lines = [hdr, "-" * len(hdr)]
    for name, r in out["policies"].items():
        w = r["wait_seconds"]
        ratio = "" if r["oracle_ratio"] is None else f"{r['oracle_ratio']:.2f}"
        lines.append(
            f"{name:<17} {r['requests']:>9} {r['cold_starts']:>8} {r['cold_start_share'] * 100:>6.2f}% "
            f"{r['p75_model_cold_start_share'] * 100:>6.1f}% {w['p50']:>8.2f} {w['p95']:>7.2f} {w['p99']:>7.2f} "
            f"{r['cold_wait_seconds']['total']:>11.0f} "
            f"{r['loads']:>7} {r['bytes_loaded'] / GIB / 1024:>7.2f} {r['memory_gib_hours']['idle']:>9.0f} "
            f"{r['memory_gib_hours']['total']:>9.0f} {ratio:>7}"
        )
    hdr = f"{'roi':<17} {'GiB·h held':>10} {'warm hits':>10} {'cold':>8} {'avoided':>8}"
    lines += ["", hdr, "-" * len(hdr)]
    for name, r in out["policies"].items():
        roi = r["roi"]
        lines.append(f"{name:<17} {roi['gpu_memory_gib_hours']:>10.0f} {roi['warm_hits']:>10} "
                     f"{roi['cold_starts']:>8} {roi['cold_starts_avoided']:>8}")
    if out.get("slo"):
        lines.append("")
        for name, r in out["policies"].items():
            if "slo" in r:
                s = r["slo"]
                lines.append(f"{name} with the SLO ({s['line']}): {s['steps_up']} step(s) up, {s['steps_down']} "
                             f"down, highest level {s['max_level']}, mean speculative share "
                             f"{s['mean_speculative_share']:.0%}")
    if any("adapters" in r for r in out["policies"].values()):
        lines += ["", adapter_table(out)]
    if out["fleet"].get("host_bytes"):
        hdr = f"{'host tier':<17} {'stages':>8} {'TiB staged':>10} {'unstages':>8} {'promotions':>10} {'host GiBh':>9}"
        lines += ["", hdr, "-" * len(hdr)]
        for name, r in out["policies"].items():
            lines.append(
                f"{name:<17} {r['stages']:>8} {r['bytes_staged'] / GIB / 1024:>10.2f} {r['unstages']:>8} "
                f"{r['promotions']:>10} {r['host_memory_gib_hours']:>9.0f}"
            )
    return "\n".join(lines)


def adapter_table(out: dict) -> str:
    """The adapter view's split (issue 29): engine starts (base loads), cold requests that waited on a base
    start or on an adapter load only, adapter loads (planned ahead of them), and the waits of each kind."""
    hdr = (f"{'adapters':<17} {'engine st':>9} {'waited':>6} {'cold eng':>8} {'cold adp':>8} {'adp loads':>9} {'ahead':>7} "
           f"{'adp evict':>9} {'eng wait s':>10} {'adp wait s':>10} {'adp max':>7} {'>load':>6}")
    lines = [hdr, "-" * len(hdr)]
    for name, r in out["policies"].items():
        a = r.get("adapters")
        if a is None:
            continue
        lines.append(
            f"{name:<17} {a['engine_starts']:>9} {a['engine_starts_waited']:>6} {a['cold_engine']:>8} {a['cold_adapter']:>8} "
            f"{a['adapter_loads']:>9} {a['adapter_loads_ahead']:>7} {a['adapter_evictions']:>9} "
            f"{a['engine_wait_seconds']['total']:>10.0f} {a['adapter_wait_seconds']['total']:>10.0f} "
            f"{a['adapter_wait_seconds']['max']:>7.2f} {a['adapter_wait_over_load_max']:>6.2f}")
    return "\n".join(lines)


def plot(out: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for name, r in out["policies"].items():
        x = r["memory_gib_hours"]["total"]
        y = r["cold_start_share"] * 100
        ax.scatter([x], [y], s=40)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=9)
    fl = out["fleet"]
    ax.set_xlabel("GPU memory-time held (GiB·h)")
    ax.set_ylabel("cold-start share of requests (%)")
    ax.set_title(f"{Path(out['trace']['source']).parent.name or out['trace']['source']}: "
                 f"{fl['gpus']} GPUs × {fl['gpu_bytes'] / GIB:.0f} GiB, {fl['contention']} load bandwidth, "
                 f"{fl.get('load_slots') or 'unlimited'} load slots",
                 fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_cli(args: argparse.Namespace) -> int:
    names = args.policies
    try:
        slo = parse_slo(args.slo, "--slo") if args.slo else None
        idle_budget = parse_idle_memory_budget(args.idle_memory_budget, "--idle-memory-budget")
        max_wait = parse_max_demand_wait(args.max_demand_wait, "--max-demand-wait")
        trace = read_trace(args.trace, args.format, args.seed, args.hours)
    except (OSError, ValueError) as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    if args.load_slots < 0:
        print("simulate: --load-slots must be 0 (no limit) or a positive number of loads per GPU",
              file=sys.stderr)
        return 2
    try:  # simulate() reads the profile before it replays anything
        out = simulate(trace, args.profile, names, args.gpus, args.gpu_memory, args.contention, progress=True,
                       host_bytes=args.host_memory, stage_bandwidth=args.stage_bandwidth,
                       promote_bandwidth=args.promote_bandwidth,
                       load_slots=args.load_slots, slo=slo, idle_memory_budget=idle_budget,
                       max_demand_wait=max_wait, no_regret=args.no_regret == "on",
                       adapter_slot_replicas=args.adapter_slot_replicas == "on", link_wait=args.link_wait == "on",
                       refute_stale_rate=args.refute_stale_rate)
    except (OSError, ProfileError) as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    out["seed"] = args.seed
    print(table(out))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    if args.plot:
        plot(out, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prewarm")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))
