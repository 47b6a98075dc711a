"""Write the adapter view's profile of a ServeGen trace (issue 29, item 5):

    python -m simulator.adapter_profile ../shared/traces/servegen-lang-14d/profile.csv OUT.csv [--max-adapters 8]

ServeGen's streams are per-client traffic of three model tiers (`m-small.c017`: client 17 of m-small), so they
read naturally as per-client LoRA adapters of one base per tier. The profile written (simulator.adapters
documents its columns):
- one base per tier, named by the tier (`m-small`, `m-mid`, `m-large`), with the tier's size and load time
  from the source profile (the 7B / 14B / 32B class at BF16: 15.2 / 29.4 / 65.0 GB, engine start 10.0 /
  17.9 / 37.8 s) and `max_adapters` LoRA slots per replica (vLLM `--max-loras`; default 8: the catalog's
  default is 4, vLLM's 1; ServeGen has 10 / 19 / 7 streams of the tiers active in a median minute of its
  first 72 h, so 8 slots hold the small and large tiers' working set on one replica and not the mid tier's);
- each stream an adapter of its tier's base: rank 16 on the attention projections (q, k, v, o: PEFT's usual
  target set) at BF16, i.e. 16 × Σ(d_in + d_out) × 2 bytes per layer: 20.2 MB for the 7B class (hidden
  3584, 28 layers, 4 KV heads of 128), 50.3 MB for 14B (5120, 48 layers, 8 KV heads), 67.1 MB for 32B
  (5120, 64 layers, 8 KV heads) — Qwen2.5's shapes; load into a running engine = 0.2 s (vLLM's
  add_lora: parse the PEFT checkpoint, build the LoRA model, copy into a slot) + bytes at 100 MB/s, i.e.
  0.40 / 0.70 / 0.87 s. Assumed, not measured: `prewarm bench engine <adapter>` measures the demo's.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

# tier -> (hidden, layers, KV width = KV heads × head dim): Qwen2.5 7B / 14B / 32B
SHAPES = {"m-small": (3584, 28, 512), "m-mid": (5120, 48, 1024), "m-large": (5120, 64, 1024)}
RANK = 16
LOAD_FIXED_S = 0.2
LOAD_BYTES_PER_S = 100e6


def adapter_bytes(hidden: int, layers: int, kv: int, rank: int = RANK) -> int:
    """LoRA A and B of q, k, v, o at BF16: rank × (d_in + d_out) × 2 bytes each, per layer."""
    per_layer = (hidden + hidden) + (hidden + kv) + (hidden + kv) + (hidden + hidden)
    return rank * per_layer * 2 * layers


def adapter_load_seconds(size: int) -> float:
    return round(LOAD_FIXED_S + size / LOAD_BYTES_PER_S, 3)


def write_profile(source: str | Path, out: str | Path, max_adapters: int = 8) -> int:
    """Read the ServeGen profile (`model,size_bytes,load_seconds`, models `<tier>.<client>`), write the
    adapter view's; returns the adapters written."""
    with open(source, newline="") as f:
        rows = list(csv.DictReader(f))
    bases: dict[str, tuple[str, str]] = {}
    adapters: list[list[str | int | float]] = []
    for row in rows:
        tier = row["model"].split(".", 1)[0]
        if tier not in SHAPES:
            raise ValueError(f"{source}: model {row['model']!r} is not of a known tier ({', '.join(SHAPES)})")
        base = bases.setdefault(tier, (row["size_bytes"], row["load_seconds"]))
        if base != (row["size_bytes"], row["load_seconds"]):
            raise ValueError(f"{source}: tier {tier} has models of different sizes or load times")
        size = adapter_bytes(*SHAPES[tier])
        adapters.append([row["model"], size, adapter_load_seconds(size), tier, ""])
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "size_bytes", "load_seconds", "base", "max_adapters"])
        for tier, (size_s, load_s) in bases.items():
            w.writerow([tier, size_s, load_s, "", max_adapters])
        w.writerows(adapters)
    return len(adapters)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.adapter_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="the ServeGen trace's profile.csv")
    p.add_argument("out", help="where to write the adapter view's profile")
    p.add_argument("--max-adapters", type=int, default=8, help="LoRA slots per base replica (default 8)")
    args = p.parse_args(argv)
    if args.max_adapters < 1:
        print("adapter_profile: --max-adapters must be at least 1", file=sys.stderr)
        return 2
    n = write_profile(args.source, args.out, args.max_adapters)
    print(f"{args.out}: {n} adapters of {len(SHAPES)} bases, {args.max_adapters} slots per base replica")
    return 0


if __name__ == "__main__":
    sys.exit(main())
