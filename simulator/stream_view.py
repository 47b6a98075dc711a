"""Write a small-model view of a per-minute trace: traffic of the shape issue 26 keeps outside the project
(tens of models, 2-7 GiB checkpoints, weeks long, one to four 40 GiB GPUs), for checking a policy change on
traffic no rule here was chosen on:

    python -m simulator.stream_view ../shared/traces/servegen-lang-14d/invocations.csv OUT_DIR
    prewarm simulate OUT_DIR/invocations.csv --profile OUT_DIR/profile.csv --gpus 1 --gpu-memory 40GiB --policies all

It keeps every `every`-th row of the `top` busiest (so popularity still varies; default 60 of the 180 busiest
ServeGen streams, 1.8 M requests over 14 days) as they are, and gives each model a size drawn uniformly from
`min_gib`-`max_gib` GiB, seeded by its name, with the profiles' load-time rule (1.5 s + size at 2 GiB/s + 0.1 s
per GiB, simulator.trace.default_load_seconds). On it the no-regret layer once cost 5x the cold starts of
prewarm's own order, while the request count it read halved with busy models' histograms (docs/simulation.md,
"The layer off by default" and "The layer on again").

`--top 313 --every 5` (or `--every 4`, or `--every 2 --min-gib 1 --max-gib 5`) takes streams from the whole popularity
range instead: sparse traffic, where a fleet of four to eight GPUs holds most of the catalog and cold starts come hours
apart (docs/simulation.md, "Sparse traffic").
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import random
import sys
from pathlib import Path

from prewarm import arg_types
from prewarm.domain import trace_format as tf

from .trace import GIB, default_load_seconds


def write_view(source: str | Path, out_dir: str | Path, top: int = 180, every: int = 3,
               min_gib: float = 2.0, max_gib: float = 7.0) -> int:
    """Write OUT_DIR/invocations.csv and OUT_DIR/profile.csv; returns the models kept."""
    if top < 1 or every < 1 or not 0 < min_gib <= max_gib:
        raise ValueError(f"need top >= 1, every >= 1 and 0 < min_gib <= max_gib (got {top}, {every}, "
                         f"{min_gib}, {max_gib})")
    with open(source, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None) or []
        try:  # the format's rules (prewarm.domain.trace_format), as the simulator reads the view after
            name = tf.function_column(header)
            counts = [i for i, _n in tf.minute_columns(header)]
        except ValueError as e:
            raise tf.at(source, 1, f"not an azure-minute trace: {e}") from None
        rows = []
        for line, row in tf.rows(reader, len(header), source):
            try:
                total = sum(tf.count(row[i]) for i in counts)
            except ValueError as e:
                raise tf.at(source, line, str(e)) from None
            rows.append((total, line, row))
    rows.sort(key=lambda x: (-x[0], x[1]))  # busiest first; ties in file order
    kept = [row for _total, _n, row in rows[:top:every]]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "invocations.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(kept)
    with open(out / "profile.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "size_bytes", "load_seconds"])
        for row in kept:
            model = row[name]
            rnd = random.Random(int(hashlib.sha256(model.encode()).hexdigest()[:8], 16))
            size = int(rnd.uniform(min_gib, max_gib) * GIB)
            w.writerow([model, size, round(default_load_seconds(size), 3)])
    return len(kept)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.stream_view", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="an azure-minute trace (e.g. ../shared/traces/servegen-lang-14d/invocations.csv)")
    p.add_argument("out_dir", type=arg_types.output_folder)
    p.add_argument("--top", type=int, default=180, help="the busiest rows considered (default 180)")
    p.add_argument("--every", type=int, default=3, help="keep every n-th of them (default 3)")
    p.add_argument("--min-gib", type=float, default=2.0)
    p.add_argument("--max-gib", type=float, default=7.0)
    a = p.parse_args(argv)
    try:
        n = write_view(a.trace, a.out_dir, a.top, a.every, a.min_gib, a.max_gib)
    except (OSError, ValueError) as e:
        print(f"stream_view: {e}", file=sys.stderr)
        return 2
    print(f"{n} models written to {a.out_dir}/invocations.csv and profile.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
