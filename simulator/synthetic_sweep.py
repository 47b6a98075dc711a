"""Every policy on the synthetic regimes (simulator.synthetic): the fleet sweep's table, on traffic no rule here was
tuned on (issue 26: a policy that never does worse than the best expert it can imitate).

    python -m simulator.synthetic_sweep [--regimes zipf,onoff|all] [--gpus 4,8,16] [--seeds 0,1] [--jobs 2]
        [--models 200 --hours 24 --requests 150000] [--policies all] [--out DIR]

Each (regime, seed) is generated into OUT/traces/synthetic-REGIME-sSEED (the seed draws the trace), then every
policy runs on it at each GPU count as one job of the sweep's (simulator.sweep.run_one); OUT/sweep.json and
OUT/sweep.md are the sweep's own formats (the seed column is the trace's seed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from prewarm import arg_types

from . import synthetic
from .policies import POLICIES
from .sweep import Job, Point, Sample, add_prewarm_switches, markdown, point_summary, points, run_one


def _list(s: str, known: tuple[str, ...] | None, what: str) -> list[str]:
    items = [x.strip() for x in s.split(",") if x.strip()]
    if known is not None:
        if items == ["all"]:
            return list(known)
        bad = [x for x in items if x not in known]
        if bad:
            raise ValueError(f"--{what}: unknown {', '.join(bad)} (known: {', '.join(known)}, or all)")
    if not items:
        raise ValueError(f"--{what}: name at least one")
    return items


def _whole(items: list[str], what: str, example: str) -> list[int]:
    bad = [x for x in items if not x.lstrip("-").isdigit()]
    if bad:
        raise ValueError(f"--{what}: {', '.join(repr(x) for x in bad)} is not a whole number (e.g. --{what} {example})")
    return [int(x) for x in items]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.synthetic_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--regimes", default="all", help=f"comma list of {', '.join(synthetic.REGIMES)}, or all")
    p.add_argument("--gpus", default="4,8,16")
    p.add_argument("--seeds", default="0")
    p.add_argument("--gpu-memory", type=arg_types.size_at_least(1), default="80GiB")
    p.add_argument("--load-slots", type=int, default=2)
    p.add_argument("--policies", default="all")
    p.add_argument("--models", type=int, default=200)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--requests", type=int, default=150_000)
    add_prewarm_switches(p)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", default="synthetic-sweep", type=arg_types.output_folder)
    a = p.parse_args(argv)
    try:
        regimes = _list(a.regimes, synthetic.REGIMES, "regimes")
        policies = _list(a.policies, tuple(POLICIES), "policies")
        gpus = _whole(_list(a.gpus, None, "gpus"), "gpus", "4,8,16")
        seeds = _whole(_list(a.seeds, None, "seeds"), "seeds", "0,1")
        gpu_bytes = a.gpu_memory
        if min(gpus) < 1 or gpu_bytes <= 0 or a.jobs < 1 or a.load_slots < 0 or min(seeds) < 0:
            raise ValueError("--gpus, --gpu-memory and --jobs must be positive, --load-slots and --seeds 0 or more")
        out = Path(a.out)
        jobs: list[Job] = []
        for regime in regimes:
            for seed in seeds:
                name = f"synthetic-{regime}-s{seed}"
                folder = out / "traces" / name
                # always written anew: a folder left by a run with other sizes must not be measured as this one
                synthetic.write(regime, folder, a.models, a.hours, a.requests, seed)
                sample = Sample(name, "synthetic", fmt="requests", file="requests.csv")
                jobs += [Job(Point(sample, g, seed, None), pol, str(folder), gpu_bytes, a.load_slots, None,
                             link_wait=a.link_wait == "on", refute_stale_rate=a.refute_stale_rate)
                         for g in gpus for pol in policies]
    except (OSError, ValueError) as e:
        print(f"synthetic_sweep: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows: list[dict] = []
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        futures = [pool.submit(run_one, j) for j in sorted(jobs, key=lambda j: j.policy != "prewarm")]
        for f in as_completed(futures):
            r = f.result()
            rows.append(r)
            print(f"  {r['sample']} × {r['gpus']} {r['policy']}: {r['cold_starts']:,} cold starts in "
                  f"{r['runtime_s']} s", file=sys.stderr)
    summaries = [{"sample": k[0], "gpus": k[1], "seed": k[2], **s}
                 for k, pols in points(rows).items() if (s := point_summary(pols)) is not None]
    (out / "sweep.json").write_text(json.dumps(
        {"load_slots": a.load_slots, "gpu_bytes": gpu_bytes, "rows": rows, "points": summaries,
         "generated": {"models": a.models, "hours": a.hours, "requests": a.requests},
         "wall_seconds": round(time.perf_counter() - t0, 1)}, indent=2) + "\n")
    md = markdown(rows, a.load_slots)
    (out / "sweep.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
