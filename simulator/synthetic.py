"""Seeded synthetic traces, one per traffic regime, for checking a policy on traffic no rule here was tuned on.

Issue 26 asks that prewarm never do worse than the best expert it can imitate, on any traffic. The two real
families (Azure 2019, ServeGen) each favour some experts; these regimes are the textbook cases where a known
expert is the right one, so a loss on any of them names the rule that fails:

- `zipf`: stationary Poisson arrivals with Zipf popularity (frequency wins: LFU / greedy-dual).
- `shifting`: the same, but the popularity ranking is re-drawn every `shift_h` hours (recency wins: LRU adapts,
  counts go stale).
- `onoff`: each model alternates between bursts (Poisson at its rate) and silences with heavy-tailed (Pareto)
  lengths (recency within a burst; a long silence is the time to evict).
- `periodic`: timer-like models that fire every 1-60 minutes with a little jitter, over a Poisson background
  (prediction wins: the idle-time histogram, the forecast rule).
- `diurnal`: Zipf rates modulated by a 24 h cycle with a per-model phase (prediction over the day).

    python -m simulator.synthetic zipf OUT_DIR [--models 200 --hours 24 --requests 150000 --seed 0]
    prewarm simulate OUT_DIR/requests.csv --format requests --profile OUT_DIR/profile.csv --gpus 4 --policies all

Sizes are log-uniform between `min_gib` and `max_gib` (seeded), with the profiles' load-time rule
(simulator.trace.default_load_seconds). The request count is the expected one; the draw varies around it.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np

from prewarm import arg_types

from .trace import GIB, default_load_seconds

REGIMES = ("zipf", "shifting", "onoff", "periodic", "diurnal")


def _zipf_weights(n: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf popularity over `n` models in a random order, summing to 1."""
    w = 1.0 / np.arange(1, n + 1) ** alpha
    return rng.permutation(w / w.sum())


def _poisson_times(rates: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Requests of a Poisson process whose rate is constant within each minute: `rates` is
    [models, minutes] in requests per second. Returns (times, model indices), unsorted."""
    counts = rng.poisson(rates * 60.0)
    mids, minutes = np.nonzero(counts)
    reps = counts[mids, minutes]
    mids = np.repeat(mids, reps)
    starts = np.repeat(minutes, reps) * 60.0
    return starts + rng.uniform(0.0, 60.0, len(starts)), mids


def generate(regime: str, models: int = 200, hours: float = 24.0, requests: int = 150_000, seed: int = 0,
             alpha: float = 1.0, shift_h: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """(times in seconds, sorted; model index per request) of `regime` (one of REGIMES)."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r} (known: {', '.join(REGIMES)})")
    if models < 1 or not 0 < hours < math.inf or requests < 1 or not 0 < shift_h < math.inf:
        raise ValueError("need models >= 1, finite hours > 0, requests >= 1 and finite shift_h > 0 "
                         f"(got {models}, {hours:g}, {requests}, {shift_h:g})")
    rng = np.random.default_rng(seed)
    minutes = max(1, int(round(hours * 60)))
    span = minutes * 60.0
    mean_rate = requests / span  # requests per second over the whole fleet
    if regime == "zipf":
        w = _zipf_weights(models, alpha, rng)
        times, mids = _poisson_times(np.repeat((w * mean_rate)[:, None], minutes, axis=1), rng)
    elif regime == "shifting":
        per = max(1, int(round(shift_h * 60)))
        cols = [np.repeat((_zipf_weights(models, alpha, rng) * mean_rate)[:, None], min(per, minutes - s), axis=1)
                for s in range(0, minutes, per)]
        times, mids = _poisson_times(np.concatenate(cols, axis=1), rng)
    elif regime == "diurnal":
        w = _zipf_weights(models, alpha, rng)
        phase = rng.uniform(0.0, 2 * np.pi, models)
        t = np.arange(minutes) / (24 * 60) * 2 * np.pi
        shape = 1.0 + 0.9 * np.sin(t[None, :] + phase[:, None])  # mean 1 over a day
        times, mids = _poisson_times((w * mean_rate)[:, None] * shape, rng)
    elif regime == "onoff":
        w = _zipf_weights(models, alpha, rng)
        on = np.zeros((models, minutes))
        for m in range(models):
            # burst and silence lengths in minutes: Pareto (shape 1.5), bursts ~10 min, silences ~60 min at the scale
            at, active = 0, bool(rng.random() < 0.2)
            while at < minutes:
                length = int(np.ceil((10.0 if active else 60.0) * (1.0 + rng.pareto(1.5))))
                if active:
                    on[m, at:at + length] = 1.0
                at += length
                active = not active
        share = on.mean(axis=1)
        w = np.where(share > 0, w, 0.0)  # a model never on in the span gets no requests: the rest carry its share
        w = w / w.sum() if w.sum() > 0 else w
        rates = (w * mean_rate / np.maximum(share, 1.0 / minutes))[:, None] * on
        times, mids = _poisson_times(rates, rng)
    else:  # periodic
        periods = rng.choice([60.0, 300.0, 600.0, 1800.0, 3600.0], models)
        timers = rng.random(models) < 0.6
        t_parts, m_parts = [], []
        for m in np.nonzero(timers)[0]:
            first = rng.uniform(0.0, periods[m])
            ticks = np.arange(first, span, periods[m])
            t_parts.append(ticks + rng.normal(0.0, 2.0, len(ticks)))
            m_parts.append(np.full(len(ticks), m))
        timed = sum(len(p) for p in t_parts)
        w = _zipf_weights(models, alpha, rng) * ~timers
        w = w / w.sum() if w.sum() > 0 else w
        rest = max(0.0, requests - timed) / span
        bt, bm = _poisson_times(np.repeat((w * rest)[:, None], minutes, axis=1), rng)
        times = np.concatenate([*t_parts, bt])
        mids = np.concatenate([*m_parts, bm])
    keep = (times >= 0.0) & (times < span)
    times, mids = times[keep], mids[keep]
    order = np.argsort(times, kind="stable")
    return times[order], mids[order].astype(np.int32)


def write(regime: str, out_dir: str | Path, models: int = 200, hours: float = 24.0, requests: int = 150_000,
          seed: int = 0, min_gib: float = 1.0, max_gib: float = 40.0, alpha: float = 1.0,
          shift_h: float = 4.0) -> int:
    """Write OUT_DIR/requests.csv (`timestamp,model`) and OUT_DIR/profile.csv; returns the requests written."""
    if not 0 < min_gib <= max_gib < math.inf:
        raise ValueError(f"need 0 < min_gib <= max_gib, finite (got {min_gib:g}, {max_gib:g})")
    if seed < 0:
        raise ValueError(f"--seed must be a whole number of at least 0, got {seed}")
    times, mids = generate(regime, models, hours, requests, seed, alpha, shift_h)
    names = [f"{regime}.m{i:04d}" for i in range(models)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "model"])
        w.writerows((f"{t:.3f}", names[m]) for t, m in zip(times.tolist(), mids.tolist(), strict=True))
    sizes = np.exp(np.random.default_rng(seed + 1).uniform(np.log(min_gib), np.log(max_gib), models))
    with open(out / "profile.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "size_bytes", "load_seconds"])
        for name, gib in zip(names, sizes.tolist(), strict=True):
            size = int(gib * GIB)
            w.writerow([name, size, round(default_load_seconds(size), 3)])
    return len(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simulator.synthetic", description=__doc__.split("\n\n")[0])
    p.add_argument("regime", choices=REGIMES)
    p.add_argument("out_dir", type=arg_types.output_folder)
    p.add_argument("--models", type=int, default=200)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--requests", type=int, default=150_000, help="expected requests in all (default 150,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-gib", type=float, default=1.0)
    p.add_argument("--max-gib", type=float, default=40.0)
    p.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent of popularity (default 1)")
    p.add_argument("--shift-hours", type=float, default=4.0, help="shifting: hours between re-drawn rankings")
    a = p.parse_args(argv)
    try:
        n = write(a.regime, a.out_dir, a.models, a.hours, a.requests, a.seed, a.min_gib, a.max_gib, a.alpha,
                  a.shift_hours)
    except (OSError, ValueError) as e:
        print(f"synthetic: {e}", file=sys.stderr)
        return 2
    print(f"{n} requests of {a.models} models written to {a.out_dir}/requests.csv and profile.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
