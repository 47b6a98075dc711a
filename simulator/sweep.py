"""The fleet sweep (issue 12): every policy on both Azure samples at several fleet sizes and seeds,
on the slot engine; one markdown table and a plot of prewarm ÷ best baseline against fleet size.

`prewarm simulate-sweep` or `python -m simulator.sweep [--traces DIR] [--jobs N] [--out DIR]`.
Each (sample, GPUs, seed, policy) run is one job; `--jobs` runs that many processes at once.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from prewarm.config import parse_idle_memory_budget
from prewarm.domain.policy import PolicyConfig

from .policies import POLICIES
from .run import simulate
from .trace import GIB, Trace, load_azure_minute, parse_bytes

SAMPLES = ("azure2019-1350", "azure2019-500")
REFERENCE = ("prewarm", "oracle")  # not baselines: the policy under test and the clairvoyant reference


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--traces", default=os.environ.get("PREWARM_TRACES", "../shared/traces"),
                   help="folder holding <sample>/invocations.csv and <sample>/profile.csv "
                   "(default $PREWARM_TRACES or ../shared/traces)")
    p.add_argument("--samples", default=",".join(SAMPLES), help="comma list of sample folders")
    p.add_argument("--gpus", default="8,16,32", help="comma list of fleet sizes")
    p.add_argument("--seeds", default="0,1", help="comma list of spreading seeds")
    p.add_argument("--gpu-memory", default="80GiB")
    p.add_argument("--policies", default="all", help=f"comma list of {','.join(POLICIES)} or all")
    p.add_argument("--load-slots", type=int, default=PolicyConfig().max_loads_per_gpu,
                   help="loads one GPU runs at once, for every policy (default %(default)s)")
    p.add_argument("--idle-memory-budget", default=None,
                   help="prewarm only: share of each GPU that replicas with no expected demand may hold "
                   "(default unlimited)")
    p.add_argument("--keep", metavar="SWEEP_JSON",
                   help="an earlier sweep.json: its rows of every sweep point and policy not run now are "
                   "kept, so that e.g. --policies prewarm --keep docs/simulation-sweep.json reruns prewarm "
                   "alone and writes the whole table")
    p.add_argument("--jobs", type=int, default=1, help="simulations run at once (processes)")
    p.add_argument("--out", default="sweep", help="folder for sweep.json, sweep.md and sweep.png")


def _ints(s: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{what}: expected a comma list of whole numbers, got {s!r}") from None
    if not out:
        raise ValueError(f"--{what}: empty list")
    return out


@functools.lru_cache(maxsize=4)
def _trace(path: str, seed: int) -> Trace:
    return load_azure_minute(path, seed)


def run_one(job: tuple[str, str, int, int, int, str, int, float | None]) -> dict[str, Any]:
    """One policy on one sweep point (runs in a worker process)."""
    sample, folder, gpus, gpu_bytes, seed, policy, slots, idle_budget = job
    trace = _trace(str(Path(folder) / "invocations.csv"), seed)
    out = simulate(trace, str(Path(folder) / "profile.csv"), [policy], gpus, gpu_bytes, load_slots=slots,
                   idle_memory_budget=idle_budget)
    res = out["policies"][policy]
    return {"sample": sample, "gpus": gpus, "seed": seed, "policy": policy, "models": len(trace.models),
            "requests": trace.requests, **{k: res[k] for k in
                                           ("cold_starts", "loads", "bytes_loaded", "memory_gib_hours",
                                            "wait_seconds", "queued_loads", "runtime_s")}}


def points(rows: list[dict]) -> dict[tuple[str, int, int], dict[str, dict]]:
    """(sample, gpus, seed) -> policy -> row."""
    out: dict[tuple[str, int, int], dict[str, dict]] = {}
    for r in rows:
        out.setdefault((r["sample"], r["gpus"], r["seed"]), {})[r["policy"]] = r
    return dict(sorted(out.items(), key=lambda kv: (SAMPLES.index(kv[0][0]) if kv[0][0] in SAMPLES else 9,
                                                    kv[0][0], kv[0][1], kv[0][2])))


def best_baseline(pols: dict[str, dict]) -> tuple[str, dict] | None:
    base = [(r["cold_starts"], n) for n, r in pols.items() if n not in REFERENCE]
    if not base:
        return None
    _c, name = min(base)
    return name, pols[name]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "—"


def markdown(rows: list[dict], slots: int) -> str:
    pts = points(rows)
    names = [n for n in POLICIES if any(n in p for p in pts.values())]
    lines = [
        f"Slot engine ({slots or 'unlimited'} load slots per GPU), 80 GiB GPUs, shared load bandwidth. "
        "Best baseline: the fewest cold starts among the policies other than prewarm and the oracle. "
        "Bytes loaded and memory-time: prewarm's, and ÷ the best baseline's.",
        "",
        "| sample | GPUs | seed | prewarm cold starts | best baseline | prewarm ÷ best | oracle | "
        "prewarm TiB loaded (÷ best) | prewarm memory-time GiB·h (÷ best) |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for (sample, gpus, seed), pols in pts.items():
        pw, bb, orc = pols.get("prewarm"), best_baseline(pols), pols.get("oracle")
        if pw is None or bb is None:
            continue
        bn, br = bb
        oracle = f"{orc['cold_starts']:,}" if orc else "—"
        pmt, bmt = pw["memory_gib_hours"]["total"], br["memory_gib_hours"]["total"]
        lines.append(
            f"| {sample} | {gpus} | {seed} | {pw['cold_starts']:,} | {bn} {br['cold_starts']:,} | "
            f"**{_ratio(pw['cold_starts'], br['cold_starts'])}** | {oracle} | "
            f"{pw['bytes_loaded'] / GIB / 1024:.1f} ({_ratio(pw['bytes_loaded'], br['bytes_loaded'])}) | "
            f"{pmt:,.0f} ({_ratio(pmt, bmt)}) |")
    lines += ["", "Cold starts of every policy:", "",
              "| sample | GPUs | seed | " + " | ".join(names) + " |",
              "|---|---:|---:|" + "---:|" * len(names)]
    for (sample, gpus, seed), pols in pts.items():
        cells = [f"{pols[n]['cold_starts']:,}" if n in pols else "" for n in names]
        lines.append(f"| {sample} | {gpus} | {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for (sample, gpus, seed), pols in points(rows).items():
        pw, bb = pols.get("prewarm"), best_baseline(pols)
        if pw is not None and bb is not None and bb[1]["cold_starts"]:
            series.setdefault((sample, seed), []).append((gpus, pw["cold_starts"] / bb[1]["cold_starts"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (sample, seed), pts in series.items():
        xs, ys = zip(*sorted(pts), strict=True)
        ax.plot(xs, ys, marker="o", linestyle="-" if seed == 0 else "--", label=f"{sample}, seed {seed}")
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.axhline(0.5, color="grey", linewidth=1, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs (80 GiB each)")
    ax.set_ylabel("prewarm cold starts ÷ best baseline's")
    ax.set_title("Fleet sweep on the slot engine (below 1: prewarm has fewer)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def kept_rows(path: str, gpu_bytes: int, slots: int, rerun: set[tuple[str, int, int, str]]) -> list[dict]:
    """The rows of an earlier sweep.json for every (sample, gpus, seed, policy) not rerun now;
    refused (ValueError) when that sweep ran on other GPUs or load slots, whose figures would not
    compare."""
    try:
        old = json.loads(Path(path).read_text())
        rows = old["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--keep {path}: not a sweep.json this command wrote ({e})") from None
    if old.get("gpu_bytes") != gpu_bytes or old.get("load_slots") != slots:
        raise ValueError(f"--keep {path}: it ran with gpu_bytes={old.get('gpu_bytes')}, load_slots="
                         f"{old.get('load_slots')}; this sweep has {gpu_bytes} and {slots}: rerun with the same "
                         "--gpu-memory and --load-slots")
    return [r for r in rows if (r.get("sample"), r.get("gpus"), r.get("seed"), r.get("policy")) not in rerun]


def run_cli(args: argparse.Namespace) -> int:
    try:
        gpus = _ints(args.gpus, "gpus")
        seeds = _ints(args.seeds, "seeds")
        gpu_bytes = parse_bytes(args.gpu_memory)
        idle_budget = parse_idle_memory_budget(args.idle_memory_budget, "--idle-memory-budget")
    except ValueError as e:
        print(f"simulate-sweep: {e}", file=sys.stderr)
        return 2
    names = list(POLICIES) if args.policies == "all" else [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        print(f"simulate-sweep: unknown policies: {', '.join(unknown)} (known: {', '.join(POLICIES)})",
              file=sys.stderr)
        return 2
    if min(gpus) < 1 or gpu_bytes <= 0 or args.jobs < 1 or args.load_slots < 0:
        print("simulate-sweep: --gpus, --gpu-memory and --jobs must be positive, --load-slots 0 or more",
              file=sys.stderr)
        return 2
    samples = [s.strip() for s in args.samples.split(",") if s.strip()]
    folders = {s: Path(args.traces) / s for s in samples}
    missing = [str(f / n) for f in folders.values() for n in ("invocations.csv", "profile.csv")
               if not (f / n).is_file()]
    if missing:
        print(f"simulate-sweep: missing {', '.join(missing)} (set --traces to the folder holding the samples)",
              file=sys.stderr)
        return 2
    jobs = [(s, str(folders[s]), g, gpu_bytes, seed, p, args.load_slots, idle_budget)
            for s in samples for g in gpus for seed in seeds for p in names]
    try:
        rows: list[dict] = [] if args.keep is None else kept_rows(
            args.keep, gpu_bytes, args.load_slots, {(j[0], j[2], j[4], j[5]) for j in jobs})
    except ValueError as e:
        print(f"simulate-sweep: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ran: list[dict] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for r in pool.map(run_one, jobs):
            ran.append(r)
            print(f"  {r['sample']} × {r['gpus']} seed {r['seed']} {r['policy']}: {r['cold_starts']:,} cold "
                  f"starts in {r['runtime_s']} s", file=sys.stderr)
    rows += ran
    (out / "sweep.json").write_text(json.dumps(
        {"load_slots": args.load_slots, "gpu_bytes": gpu_bytes, "idle_memory_budget": idle_budget,
         "rows": rows, "kept_from": args.keep,
         # of the runs made now (kept rows carry their own runtime_s)
         "cpu_seconds": round(sum(r["runtime_s"] for r in ran), 1),
         "wall_seconds": round(time.perf_counter() - t0, 1)}, indent=2) + "\n")
    md = markdown(rows, args.load_slots)
    (out / "sweep.md").write_text(md)
    plot(rows, str(out / "sweep.png"))
    print(md)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("simulate-sweep", help="run every policy on the fleet sweep (issue 12)",
                              description=__doc__.splitlines()[0])
    add_arguments(p)
    p.set_defaults(func=run_cli)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.sweep", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
