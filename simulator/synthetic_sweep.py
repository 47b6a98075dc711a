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
from .trace import GPU_MEMORY


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.synthetic_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--regimes", type=arg_types.names_of(synthetic.REGIMES), default="all",
                   help=f"comma list of {', '.join(synthetic.REGIMES)}, or all")
    p.add_argument("--gpus", type=arg_types.wholes_at_least(1), default="4,8,16")
    p.add_argument("--seeds", type=arg_types.wholes_at_least(0), default="0")
    p.add_argument("--gpu-memory", type=arg_types.size_at_least(1), default=GPU_MEMORY)
    p.add_argument("--load-slots", type=arg_types.whole_at_least(0), default=2)
    p.add_argument("--policies", type=arg_types.names_of(tuple(POLICIES)), default="all")
    p.add_argument("--models", type=arg_types.whole_at_least(1), default=200)
    p.add_argument("--hours", type=arg_types.positive, default=24.0)
    p.add_argument("--requests", type=arg_types.whole_at_least(1), default=150_000)
    add_prewarm_switches(p)
    p.add_argument("--jobs", type=arg_types.whole_at_least(1), default=1)
    p.add_argument("--out", default="synthetic-sweep", type=arg_types.output_folder)
    a = p.parse_args(argv)
    try:
        regimes, policies, gpus, seeds, gpu_bytes = a.regimes, a.policies, a.gpus, a.seeds, a.gpu_memory
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
