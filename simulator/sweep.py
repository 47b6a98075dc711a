"""The fleet sweep (issues 12, 26): every policy on both trace families, several fleets and seeds.

The families: the Azure Functions 2019 samples and ServeGen's LLM API streams, on the slot engine; one
markdown table (per point: the best baseline, the oracle, prewarm ÷ best, the gap closed, the
seconds waited) and a plot of prewarm ÷ best and of the gap closed against fleet size.

`prewarm simulate-sweep` or `python -m simulator.sweep [--traces DIR] [--family azure|servegen|all]
[--points LIST] [--hours H] [--jobs N] [--out DIR]`. Each (point, policy) run is one job; `--jobs`
runs that many processes at once. A point is (sample, GPUs, seed); `--family`, `--samples`, `--gpus`,
`--seeds` and `--points` each narrow the set, so that parts can be rerun and merged with `--keep`.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prewarm import arg_types
from prewarm.config import parse_idle_memory_budget
from prewarm.domain.policy import STALE_RATE_READINGS, PolicyConfig

from .policies import POLICIES
from .run import simulate
from .trace import GIB, GPU_MEMORY, Trace, load_profile, read_trace


@dataclass(frozen=True)
class Sample:
    """One trace of the sweep: `<traces>/<name>/<file>` in `fmt`, with `profile.csv` beside it,
    replayed for its first `hours` (None: the whole trace)."""

    name: str
    family: str
    hours: float | None = None
    fmt: str = "azure-minute"
    file: str = "invocations.csv"


# The sweep's samples, in table order. ServeGen's 14 days are cut to their first 72 h: three days
# of its daily cycle, at about the Azure day's cost per run (665,578 requests, 313 models).
CATALOGUE: tuple[Sample, ...] = (
    Sample("azure2019-1350", "azure"),
    Sample("azure2019-500", "azure"),
    Sample("servegen-lang-14d", "servegen", hours=72.0),
)
SAMPLES = tuple(s.name for s in CATALOGUE)
FAMILIES = ("azure", "servegen")
OTHER = "other"  # the family of a sample folder not in the catalogue (read as azure-minute, whole)
GPUS = (8, 16, 32)
SEEDS = (0, 1)
REFERENCE = ("prewarm", "oracle")  # not baselines: the policy under test and the clairvoyant reference


def sample_of(name: str) -> Sample:
    return next((s for s in CATALOGUE if s.name == name), Sample(name, OTHER))


@dataclass(frozen=True)
class Point:
    """One sweep point: a sample on `gpus` GPUs, its counts spread with `seed`."""

    sample: Sample
    gpus: int
    seed: int
    hours: float | None  # the horizon this run replays (the sample's, or --hours)

    @property
    def name(self) -> str:
        return f"{self.sample.name}:{self.gpus}:{self.seed}"


def sweep_points(family: str = "all", samples: list[str] | None = None, gpus: tuple[int, ...] | list[int] = GPUS,
                 seeds: tuple[int, ...] | list[int] = SEEDS, hours: float | None = None,
                 select: list[str] | None = None) -> list[Point]:
    """The points a sweep runs: the samples (default the catalogue's) of `family` (azure, servegen or
    all; a folder not in the catalogue counts only under all) × `gpus` × `seeds`, each replayed for
    `hours` or its sample's horizon; `select` keeps only the points matching one of its patterns
    `SAMPLE[:GPUS[:SEED]]` (shell wildcards allowed, e.g. `servegen*:16`). ValueError on a family,
    pattern or selection that names nothing."""
    if family != "all" and family not in FAMILIES:
        raise ValueError(f"--family: expected one of {', '.join(FAMILIES)} or all, got {family!r}")
    chosen = [sample_of(n) for n in (samples if samples is not None else SAMPLES)]
    chosen = [s for s in chosen if family == "all" or s.family == family]
    if not chosen:
        raise ValueError(f"no sample of family {family!r} among {', '.join(samples or SAMPLES)}")
    pts = [Point(s, g, seed, hours if hours is not None else s.hours)
           for s in chosen for g in gpus for seed in seeds]
    if select is None:
        return pts
    keep: list[Point] = []
    for pattern in select:
        parts = pattern.split(":")
        if len(parts) > 3 or not parts[0]:
            raise ValueError(f"--points: {pattern!r} is not SAMPLE[:GPUS[:SEED]]")
        hit = [p for p in pts if all(fnmatch.fnmatchcase(v, q) for v, q in
                                     zip((p.sample.name, str(p.gpus), str(p.seed))[:len(parts)], parts, strict=True))]
        if not hit:
            raise ValueError(f"--points: {pattern!r} matches none of this sweep's points "
                             f"({', '.join(p.name for p in pts)})")
        keep += [p for p in hit if p not in keep]
    return [p for p in pts if p in keep]  # in sweep order


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--traces", default=os.environ.get("PREWARM_TRACES", "../shared/traces"),
                   help="folder holding <sample>/invocations.csv and <sample>/profile.csv "
                   "(default $PREWARM_TRACES or ../shared/traces)")
    p.add_argument("--family", default="all", choices=[*FAMILIES, "all"],
                   help="run only this family's samples (default all)")
    p.add_argument("--samples", default=None,
                   help=f"comma list of sample folders (default: the family's, of {','.join(SAMPLES)}; "
                   "another folder is read as azure-minute invocations.csv, whole)")
    p.add_argument("--gpus", type=arg_types.wholes_at_least(1), default=",".join(map(str, GPUS)),
                   help="comma list of fleet sizes")
    p.add_argument("--seeds", type=arg_types.wholes_at_least(0), default=",".join(map(str, SEEDS)),
                   help="comma list of spreading seeds")
    p.add_argument("--points", default=None,
                   help="comma list of SAMPLE[:GPUS[:SEED]] (wildcards allowed): run only these points, "
                   "e.g. servegen-lang-14d:16:0,azure2019-500:8")
    p.add_argument("--hours", type=arg_types.positive, default=None,
                   help="replay every sample's first HOURS (a short smoke run; default each sample's "
                   "horizon: the Azure samples whole, ServeGen 72 h)")
    p.add_argument("--gpu-memory", type=arg_types.size_at_least(1), default=GPU_MEMORY)
    p.add_argument("--policies", type=arg_types.names_of(tuple(POLICIES)), default="all",
                   help=f"comma list of {','.join(POLICIES)} or all")
    p.add_argument("--load-slots", type=arg_types.whole_at_least(0), default=PolicyConfig().max_loads_per_gpu,
                   help="loads one GPU runs at once, for every policy (default %(default)s)")
    p.add_argument("--idle-memory-budget", default=None,
                   help="prewarm only: share of each GPU that replicas with no expected demand may hold "
                   "(default unlimited)")
    p.add_argument("--keep", metavar="SWEEP_JSON",
                   help="an earlier sweep.json: its rows of every sweep point and policy not run now are "
                   "kept, so that e.g. --policies prewarm --keep docs/simulation-sweep.json reruns prewarm "
                   "alone and writes the whole table")
    p.add_argument("--no-regret", choices=("on", "off"), default="on",
                   help="prewarm's no-regret layer (PolicyConfig.no_regret; on by default, as simulate)")
    add_prewarm_switches(p)
    p.add_argument("--jobs", type=arg_types.whole_at_least(1), default=1, help="simulations run at once (processes)")
    p.add_argument("--out", default="sweep", type=arg_types.output_folder,
                   help="folder for sweep.json, sweep.md and sweep.png")


def add_prewarm_switches(p: argparse.ArgumentParser) -> None:
    """prewarm's on/off settings that a sweep passes to every prewarm run (Job; the synthetic sweep's too)."""
    p.add_argument("--link-wait", choices=("on", "off"), default="on",
                   help="prewarm's demand loads wait for a busy link where that costs less (PolicyConfig.link_wait)")
    p.add_argument("--refute-stale-rate", choices=STALE_RATE_READINGS, default="auto",
                   help="when prewarm values a model whose stream has stopped by its idle-time model "
                   "(PolicyConfig.refute_stale_rate; auto by default, as simulate)")


def prewarm_switches(args: argparse.Namespace) -> dict[str, Any]:
    """This run's prewarm switches as sweep.json's header names them (kept_rows compares a kept sweep's)."""
    return {"no_regret": args.no_regret == "on", "link_wait": args.link_wait == "on",
            "refute_stale_rate": args.refute_stale_rate}


def _names(s: str | None) -> list[str] | None:
    return None if s is None else [x.strip() for x in s.split(",") if x.strip()]


@functools.lru_cache(maxsize=4)
def _trace(path: str, fmt: str, seed: int, hours: float | None) -> Trace:
    return read_trace(path, fmt, seed, hours)


@dataclass(frozen=True)
class Job:
    point: Point
    policy: str
    folder: str
    gpu_bytes: int
    slots: int
    idle_budget: float | None
    no_regret: bool = True
    link_wait: bool = True
    refute_stale_rate: str = "auto"


def run_one(job: Job) -> dict[str, Any]:
    """One policy on one sweep point (runs in a worker process): the row sweep.json keeps."""
    pt = job.point
    trace = _trace(str(Path(job.folder) / pt.sample.file), pt.sample.fmt, pt.seed, pt.hours)
    out = simulate(trace, str(Path(job.folder) / "profile.csv"), [job.policy], pt.gpus, job.gpu_bytes,
                   load_slots=job.slots, idle_memory_budget=job.idle_budget, no_regret=job.no_regret,
                   link_wait=job.link_wait, refute_stale_rate=job.refute_stale_rate)
    res = out["policies"][job.policy]
    return {"sample": pt.sample.name, "gpus": pt.gpus, "seed": pt.seed, "policy": job.policy,
            "models": len(trace.models), "requests": trace.requests,
            **{k: res[k] for k in ("cold_starts", "loads", "bytes_loaded", "memory_gib_hours",
                                   "wait_seconds", "queued_loads", "runtime_s")},
            # added by issue 26 (older rows lack them)
            "family": pt.sample.family, "hours": pt.hours,
            "cold_wait_seconds": res["cold_wait_seconds"], "unserved": res["unserved"]}


def _order(sample: str) -> tuple[int, str]:
    return (SAMPLES.index(sample) if sample in SAMPLES else len(SAMPLES), sample)


def points(rows: list[dict]) -> dict[tuple[str, int, int], dict[str, dict]]:
    """(sample, gpus, seed) -> policy -> row, in sweep order."""
    out: dict[tuple[str, int, int], dict[str, dict]] = {}
    for r in rows:
        out.setdefault((r["sample"], r["gpus"], r["seed"]), {})[r["policy"]] = r
    return dict(sorted(out.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1], kv[0][2])))


def best_baseline(pols: dict[str, dict]) -> tuple[str, dict] | None:
    base = [(r["cold_starts"], n) for n, r in pols.items() if n not in REFERENCE]
    if not base:
        return None
    _c, name = min(base)
    return name, pols[name]


def gap_closed(prewarm: int, best: int, oracle: int | None) -> float | None:
    """(best − prewarm) ÷ (best − oracle): the share of the best baseline's excess over the oracle
    that prewarm removes (1: as few cold starts as the oracle; above 1: fewer; 0 or below: no better
    than the best baseline). None where there is no gap to close: no oracle run, or the best
    baseline already has no more cold starts than the oracle (best ≤ oracle)."""
    if oracle is None or best <= oracle:
        return None
    return (best - prewarm) / (best - oracle)


def _total_wait(row: dict) -> float | None:
    w = row.get("cold_wait_seconds")  # rows from before issue 26 lack it
    return None if w is None else float(w["total"])


def point_summary(pols: dict[str, dict]) -> dict[str, Any] | None:
    """One point's figures for the table, the plot and sweep.json's `points` (None without prewarm
    or a baseline)."""
    pw, bb, orc = pols.get("prewarm"), best_baseline(pols), pols.get("oracle")
    if pw is None or bb is None:
        return None
    bn, br = bb
    best, cold = br["cold_starts"], pw["cold_starts"]
    oracle = None if orc is None else orc["cold_starts"]
    return {"best_baseline": bn, "best_cold_starts": best, "prewarm_cold_starts": cold,
            "oracle_cold_starts": oracle, "prewarm_over_best": cold / best if best else None,
            "gap": None if oracle is None else best - oracle,
            "gap_closed": gap_closed(cold, best, oracle),
            "prewarm_cold_wait_seconds": _total_wait(pw), "best_cold_wait_seconds": _total_wait(br)}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "—"


def _gap_text(s: dict[str, Any]) -> str:
    if s["gap_closed"] is not None:
        return f"**{s['gap_closed']:.2f}**"
    return "—" if s["oracle_cold_starts"] is None else "no gap"


def _seconds(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _sample_cell(sample: str, pols: dict[str, dict]) -> str:
    hours = next(iter(pols.values())).get("hours")
    return sample if hours is None else f"{sample} ({hours:g} h)"


def markdown(rows: list[dict], slots: int) -> str:
    pts = points(rows)
    names = [n for n in POLICIES if any(n in p for p in pts.values())]
    lines = [
        f"Slot engine ({slots or 'unlimited'} load slots per GPU), 80 GiB GPUs, shared load bandwidth. "
        "Best baseline: the fewest cold starts among the policies other than prewarm and the oracle. "
        "Gap closed: (best − prewarm) ÷ (best − oracle), 1 where prewarm has the oracle's cold starts, "
        "above 1 where fewer, 0 or below where no fewer than the best baseline; 'no gap' where the best "
        "baseline has no more than the oracle. Cold-wait: the seconds prewarm's cold requests waited "
        "in all. Cold-wait, bytes loaded and memory-time: prewarm's, and ÷ the best baseline's.",
        "",
        "| sample | GPUs | seed | prewarm cold starts | best baseline | prewarm ÷ best | oracle | gap closed | "
        "prewarm cold-wait s (÷ best) | prewarm TiB loaded (÷ best) | prewarm memory-time GiB·h (÷ best) |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (sample, gpus, seed), pols in pts.items():
        s = point_summary(pols)
        if s is None:
            continue
        pw, br = pols["prewarm"], pols[s["best_baseline"]]
        oracle = "—" if s["oracle_cold_starts"] is None else f"{s['oracle_cold_starts']:,}"
        pmt, bmt = pw["memory_gib_hours"]["total"], br["memory_gib_hours"]["total"]
        pws, bws = s["prewarm_cold_wait_seconds"], s["best_cold_wait_seconds"]
        lines.append(
            f"| {_sample_cell(sample, pols)} | {gpus} | {seed} | {s['prewarm_cold_starts']:,} | "
            f"{s['best_baseline']} {s['best_cold_starts']:,} | "
            f"**{_ratio(s['prewarm_cold_starts'], s['best_cold_starts'])}** | {oracle} | {_gap_text(s)} | "
            f"{_seconds(pws)} ({_ratio(pws, bws)}) | "
            f"{pw['bytes_loaded'] / GIB / 1024:.1f} ({_ratio(pw['bytes_loaded'], br['bytes_loaded'])}) | "
            f"{pmt:,.0f} ({_ratio(pmt, bmt)}) |")
    for title, cell in (("Cold starts of every policy:", lambda r: f"{r['cold_starts']:,}"),
                        ("Cold-wait seconds of every policy (total; — where a kept row predates them):",
                         lambda r: _seconds(_total_wait(r)))):
        lines += ["", title, "",
                  "| sample | GPUs | seed | " + " | ".join(names) + " |",
                  "|---|---:|---:|" + "---:|" * len(names)]
        for (sample, gpus, seed), pols in pts.items():
            cells = [cell(pols[n]) if n in pols else "" for n in names]
            lines.append(f"| {_sample_cell(sample, pols)} | {gpus} | {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    """Two panels against fleet size, one line per (sample, seed): prewarm ÷ best baseline, and the
    gap closed (points with no gap left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratio: dict[tuple[str, int], list[tuple[int, float]]] = {}
    gap: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for (sample, gpus, seed), pols in points(rows).items():
        s = point_summary(pols)
        if s is None:
            continue
        label = (_sample_cell(sample, pols), seed)
        if s["prewarm_over_best"] is not None:
            ratio.setdefault(label, []).append((gpus, s["prewarm_over_best"]))
        if s["gap_closed"] is not None:
            gap.setdefault(label, []).append((gpus, s["gap_closed"]))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    colours: dict[str, Any] = {}
    for ax, series in ((ax1, ratio), (ax2, gap)):
        for (sample, seed), pts in series.items():
            xs, ys = zip(*sorted(pts), strict=True)
            c = colours.setdefault(sample, f"C{len(colours)}")
            ax.plot(xs, ys, marker="o", color=c, linestyle="-" if seed == 0 else "--",
                    label=f"{sample}, seed {seed}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (80 GiB each)")
        ax.grid(True, alpha=0.3)
    ax1.axhline(1.0, color="grey", linewidth=1)
    ax1.axhline(0.5, color="grey", linewidth=1, linestyle=":")
    ax1.set_ylabel("prewarm cold starts ÷ best baseline's")
    ax1.set_title("prewarm ÷ best baseline (below 1: prewarm has fewer)", fontsize=10)
    ax2.axhline(0.0, color="grey", linewidth=1)
    ax2.axhline(0.5, color="grey", linewidth=1, linestyle=":")
    ax2.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax2.set_ylabel("gap closed: (best − prewarm) ÷ (best − oracle)")
    ax2.set_title("gap closed (1: the oracle's cold starts; above 0: fewer than the best)", fontsize=10)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def kept_rows(path: str, gpu_bytes: int, slots: int, rerun: set[tuple[str, int, int, str]],
              horizon: dict[str, float | None] | None = None, prewarm: dict[str, Any] | None = None) -> list[dict]:
    """The rows of an earlier sweep.json for every (sample, gpus, seed, policy) not rerun now;
    refused (ValueError) when that sweep ran on other GPUs or load slots, or replayed a sample run
    now for another horizon (`horizon`: sample -> hours this run replays), or keeps prewarm rows made with other
    prewarm switches than this run's (`prewarm`: the sweep.json header's names and this run's values), whose figures
    would not compare. A row from before issue 26 has no `hours`: it replayed its whole trace; a header without a
    switch predates it."""
    try:
        old = json.loads(Path(path).read_text())
        rows = old["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--keep {path}: not a sweep.json this command wrote ({e})") from None
    if old.get("gpu_bytes") != gpu_bytes or old.get("load_slots") != slots:
        raise ValueError(f"--keep {path}: it ran with gpu_bytes={old.get('gpu_bytes')}, load_slots="
                         f"{old.get('load_slots')}; this sweep has {gpu_bytes} and {slots}: rerun with the same "
                         "--gpu-memory and --load-slots")
    kept = [r for r in rows if (r.get("sample"), r.get("gpus"), r.get("seed"), r.get("policy")) not in rerun]
    if prewarm and any(r.get("policy") == "prewarm" for r in kept):
        for name, now in prewarm.items():
            was = old.get(name)
            if name == "refute_stale_rate" and isinstance(was, bool):
                was = "on" if was else "off"  # written as a flag before "auto"
            if was is not None and was != now:
                raise ValueError(f"--keep {path}: its prewarm rows ran with {name}={was}, this run has {now}: the "
                                 "table would mix them (rerun prewarm at every point, or with the same switch)")
    for r in kept:
        sample = r.get("sample")
        if horizon and sample in horizon and r.get("hours") != horizon[sample]:
            def h(x: float | None) -> str:
                return "the whole trace" if x is None else f"{x:g} h"
            raise ValueError(f"--keep {path}: its rows of {sample} replay {h(r.get('hours'))}, this run "
                             f"replays {h(horizon[sample])}: the table would mix horizons (rerun with the "
                             "same --hours, or without --keep)")
    return kept


def run_cli(args: argparse.Namespace) -> int:
    gpus, seeds, gpu_bytes, names = args.gpus, args.seeds, args.gpu_memory, args.policies
    try:
        idle_budget = parse_idle_memory_budget(args.idle_memory_budget, "--idle-memory-budget")
        pts = sweep_points(args.family, _names(args.samples), gpus, seeds, args.hours, _names(args.points))
    except ValueError as e:
        print(f"simulate-sweep: {e}", file=sys.stderr)
        return 2
    samples = list(dict.fromkeys(p.sample for p in pts))
    folders = {s.name: Path(args.traces) / s.name for s in samples}
    missing = [str(folders[s.name] / n) for s in samples for n in (s.file, "profile.csv")
               if not (folders[s.name] / n).is_file()]
    if missing:
        print(f"simulate-sweep: missing {', '.join(missing)} (set --traces to the folder holding the samples, "
              "or narrow the run with --family / --samples)", file=sys.stderr)
        return 2
    try:  # a malformed profile or trace is refused here, not in each job that reads it (a traceback from the pool)
        for s in samples:
            load_profile(folders[s.name] / "profile.csv", [])
            read_trace(folders[s.name] / s.file, s.fmt)
    except (OSError, ValueError) as e:
        print(f"simulate-sweep: {e}", file=sys.stderr)
        return 2
    switches = prewarm_switches(args)
    jobs = [Job(pt, pol, str(folders[pt.sample.name]), gpu_bytes, args.load_slots, idle_budget, **switches)
            for pt in pts for pol in names]
    try:
        rows: list[dict] = [] if args.keep is None else kept_rows(
            args.keep, gpu_bytes, args.load_slots,
            {(j.point.sample.name, j.point.gpus, j.point.seed, j.policy) for j in jobs},
            {pt.sample.name: pt.hours for pt in pts}, switches)
    except ValueError as e:
        print(f"simulate-sweep: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ran: list[dict | None] = [None] * len(jobs)
    # prewarm's runs are the longest: started first, they do not leave one process running alone at the end
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].policy != "prewarm")
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_one, jobs[i]): i for i in order}
        for f in as_completed(futures):
            r = f.result()
            ran[futures[f]] = r
            print(f"  {r['sample']} × {r['gpus']} seed {r['seed']} {r['policy']}: {r['cold_starts']:,} cold "
                  f"starts in {r['runtime_s']} s", file=sys.stderr)
    done = [r for r in ran if r is not None]  # every one: as_completed has yielded each future
    rows += done
    summaries = [{"sample": k[0], "gpus": k[1], "seed": k[2], "family": sample_of(k[0]).family,
                  "hours": next(iter(pols.values())).get("hours"), **s}
                 for k, pols in points(rows).items() if (s := point_summary(pols)) is not None]
    (out / "sweep.json").write_text(json.dumps(
        {"load_slots": args.load_slots, "gpu_bytes": gpu_bytes, "idle_memory_budget": idle_budget,
         **switches, "rows": rows, "kept_from": args.keep,
         # of the runs made now (kept rows carry their own runtime_s)
         "cpu_seconds": round(sum(r["runtime_s"] for r in done), 1),
         "wall_seconds": round(time.perf_counter() - t0, 1),
         # added by issue 26: per point, the best baseline, the oracle, prewarm ÷ best, the gap closed
         "jobs": args.jobs, "points": summaries}, indent=2) + "\n")
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
