"""What knowing the future would give prewarm's own plan on a trace (issue 26): prewarm as it is, beside prewarm with
one part of it made clairvoyant from the trace, the rest of the plan its own:

- `order`: each GPU's victims taken by the true next request, the farthest first (Belady's order; `Values.sort_victims`);
- `next`: every model's value (`Values.loss`, expected cold requests per second if not resident) is 1 / the seconds
  to its true next request: the GPU choice, the victims and the loads ahead all see the future exactly;
- `window`: that value is the true count of its requests from now to the end of the next `--window` (600 s: the
  ServeGen source's windows), over that span: the future's counts, not their times.

And, at each eviction, the victim's next request against its GPU's other ready replicas'.

    python -m bench.clairvoyance ../shared/traces/servegen-lang-14d --gpus 32 --hours 72 [--variants order,next,window]

The folder holds `invocations.csv` (azure-minute) or `requests.csv` (per request) and `profile.csv`. Every run uses
the pure-Python policy (a part is swapped by replacing a `Values` method in this process, which a native build's
class does not allow), so each takes a few times the native build's time. `--baselines faascache,...` adds the same
eviction figures for baselines. Prints figures, asserts nothing (docs/simulation.md, "ServeGen × 32: what knowing
the future would give").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# before the policy package is imported: the swap below needs its pure-Python classes
os.environ["PREWARM_PURE_POLICY"] = "1"

import numpy as np  # noqa: E402

from prewarm import arg_types  # noqa: E402
from prewarm.domain.policy import PolicyConfig, native  # noqa: E402
from prewarm.domain.policy import value as policy_value  # noqa: E402
from prewarm.domain.states import READY  # noqa: E402
from simulator.engine import Simulation  # noqa: E402
from simulator.policies import POLICIES, Prewarm  # noqa: E402
from simulator.trace import GPU_MEMORY, Trace, load_profile, read_trace  # noqa: E402

VARIANTS = ("order", "next", "window")


class NextRequests:
    """Each model's request times in the trace, for 'when is it asked for next, after t'."""

    def __init__(self, trace: Trace) -> None:
        self.per = trace.per_model_times()
        self.index = {m: i for i, m in enumerate(trace.models)}

    def after(self, m: int, t: float) -> float:
        """Seconds from t to model index m's next request (inf: none)."""
        a = self.per[m]
        i = int(np.searchsorted(a, t, side="right"))
        return float(a[i]) - t if i < len(a) else math.inf

    def count(self, m: int, t: float, end: float) -> int:
        """Model index m's requests after t and before end."""
        a = self.per[m]
        return int(np.searchsorted(a, end, side="left") - np.searchsorted(a, t, side="right"))


@contextmanager
def clairvoyant(variant: str | None, nexts: NextRequests, window_s: float) -> Iterator[None]:
    """Within the block, prewarm's plan has `variant`'s part read from the trace's future (None: nothing swapped)."""
    values = policy_value.Values
    kept = values.sort_victims, values.loss

    def order(self: policy_value.Values, expert: str, v: list) -> None:
        now = self.now
        v.sort(key=lambda e: (-nexts.after(nexts.index[e[1]], now) if e[1] in nexts.index else -math.inf, e[1]))

    def next_value(self: policy_value.Values, model: str) -> float:
        i = nexts.index.get(model)
        d = math.inf if i is None else nexts.after(i, self.now)
        return 0.0 if math.isinf(d) else 1.0 / max(d, 1.0)

    def window_value(self: policy_value.Values, model: str) -> float:
        i = nexts.index.get(model)
        if i is None:
            return 0.0
        end = math.floor(self.now / window_s) * window_s + 2 * window_s  # the end of the next window
        return nexts.count(i, self.now, end) / (end - self.now)

    if variant == "order":
        values.sort_victims = order  # type: ignore[method-assign]
    elif variant == "next":
        values.loss = next_value  # type: ignore[method-assign]
    elif variant == "window":
        values.loss = window_value  # type: ignore[method-assign]
    elif variant is not None:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    try:
        yield
    finally:
        values.sort_victims, values.loss = kept  # type: ignore[method-assign]


def replay(trace: Trace, sizes: np.ndarray, loads: np.ndarray, gpus: int, gpu_bytes: int, policy: str,
           nexts: NextRequests, window_s: float = 600.0) -> dict[str, Any]:
    """One run; at each eviction, the victim's next request and its GPU's other ready replicas'."""
    sim = Simulation(trace, sizes, loads, gpus, gpu_bytes, "shared", load_slots=2)
    victim_next: list[float] = []
    farthest: list[float] = []
    later: list[float] = []  # per eviction with a choice: the share of the GPU's other ready replicas asked for later
    evict = sim.evict

    def recording_evict(m: int, gi: int) -> bool:
        t = sim.now
        others = [nexts.after(x, t) for x, r in sim.gpus[gi].residents.items() if r.state == READY and x != m]
        if not evict(m, gi):
            return False
        v = nexts.after(m, t)
        victim_next.append(v)
        farthest.append(max([v, *others]))
        if others:  # an eviction from a GPU with no other ready replica had no choice of victim
            later.append(sum(1 for o in others if o > v) / len(others))
        return True

    sim.evict = recording_evict  # type: ignore[method-assign]
    variant = policy.removeprefix("prewarm+") if policy.startswith("prewarm+") else None
    with clairvoyant(variant, nexts, window_s):
        sim.run(Prewarm(PolicyConfig()) if policy == "prewarm" or variant else POLICIES[policy]())

    def pct(xs: list[float], q: float) -> float | None:
        """A sample at the q-th percentile (no interpolation: 'never asked for again' stays one); None: never."""
        x = float(np.percentile(xs, q, method="inverted_cdf")) if xs else math.inf
        return None if math.isinf(x) else round(x, 1)

    soon = [x < 600.0 for x in farthest]
    return {"policy": policy, "cold_starts": sim.cold, "evictions": len(victim_next),
            "victim_next_s": {"p25": pct(victim_next, 25), "p50": pct(victim_next, 50), "p75": pct(victim_next, 75)},
            "gpu_farthest_next_s_p50": pct(farthest, 50),
            "with_choice": len(later), "later_share_mean": round(float(np.mean(later)), 4) if later else None,
            "farthest_within_10_min": round(sum(soon) / len(soon), 4) if soon else None}


def _s(x: float | None) -> str:
    return "-" if x is None else str(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.clairvoyance", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="a trace folder: invocations.csv (azure-minute) or requests.csv, and profile.csv")
    p.add_argument("--gpus", type=arg_types.whole_at_least(1), default=32)
    p.add_argument("--gpu-memory", type=arg_types.size_at_least(1), default=GPU_MEMORY)
    p.add_argument("--hours", type=arg_types.positive, default=None)
    p.add_argument("--seed", type=arg_types.whole_at_least(0), default=0)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--window", type=arg_types.positive, default=600.0, help="the window variant's span in seconds")
    p.add_argument("--baselines", default="", help="comma list of baselines to report beside prewarm")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if native.active() is not None:
        sys.exit("bench.clairvoyance: the policy loaded its native build; run it as `python -m bench.clairvoyance`")
    folder = Path(a.folder)
    profile = folder / "profile.csv"
    try:  # bad input is said in a line, as simulate says it
        if (folder / "invocations.csv").is_file():
            trace = read_trace(folder / "invocations.csv", "azure-minute", seed=a.seed, hours=a.hours)
        elif (folder / "requests.csv").is_file():
            trace = read_trace(folder / "requests.csv", "requests", hours=a.hours)
        else:
            sys.exit(f"bench.clairvoyance: {folder} has neither invocations.csv nor requests.csv")
        sizes, loads = load_profile(profile if profile.is_file() else None, trace.models)
    except (OSError, ValueError) as e:
        sys.exit(f"bench.clairvoyance: {e}")
    baselines = [b for b in a.baselines.split(",") if b]
    unknown = [b for b in baselines if b not in POLICIES or b == "prewarm"]
    if unknown:
        sys.exit(f"bench.clairvoyance: unknown baseline(s) {', '.join(unknown)}; known: "
                 f"{', '.join(k for k in POLICIES if k != 'prewarm')}")
    variants = [v for v in a.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants):
        sys.exit(f"bench.clairvoyance: --variants takes {', '.join(VARIANTS)}, not {a.variants!r}")
    nexts = NextRequests(trace)
    rows = [replay(trace, sizes, loads, a.gpus, a.gpu_memory, name, nexts, a.window)
            for name in ("prewarm", *(f"prewarm+{v}" for v in variants), *baselines)]
    if a.json:
        print(json.dumps({"folder": str(folder), "gpus": a.gpus, "hours": a.hours, "seed": a.seed,
                          "window_s": a.window, "runs": rows}, indent=2))
        return 0
    print(f"{folder.name}, {a.gpus} GPUs, {a.hours or 'all'} h, seed {a.seed} (next request in seconds; - never)")
    print(f"{'policy':<28}{'cold':>9}{'evictions':>11}{'victim next p50 s':>19}{'GPU farthest p50 s':>20}"
          f"{'later share':>13}{'farthest < 10 min':>19}")
    for r in rows:
        print(f"{r['policy']:<28}{r['cold_starts']:>9}{r['evictions']:>11}{_s(r['victim_next_s']['p50']):>19}"
              f"{_s(r['gpu_farthest_next_s_p50']):>20}{r['later_share_mean']!s:>13}{r['farthest_within_10_min']!s:>19}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
