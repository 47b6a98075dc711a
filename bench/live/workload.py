"""The bench's work: the trace's busiest models mapped onto a small catalog of real demo models."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.trace import Trace, load_azure_minute

# model sizes in rank order (MiB), cycled: a mix, so that size does not follow popularity
SIZES_MIB = (24, 48, 16, 40, 32, 56, 20, 36, 28, 44, 18, 52, 30, 22, 60, 26)
PREFIX = "bench-"


@dataclass(frozen=True)
class Workload:
    models: list[str]  # catalog ids, busiest first
    functions: list[str]  # the trace's HashFunction each one stands for
    times: np.ndarray  # real seconds from the replay's start, sorted
    mids: np.ndarray  # index into models per request
    span_s: float  # real seconds the replay lasts
    trace_requests: int  # requests of the chosen functions in the window, before thinning

    def sim_trace(self, source: str) -> Trace:
        return Trace(list(self.models), self.times, self.mids, self.span_s, source, "bench-live")


def build(trace_path: Path, minutes: float, speed: float, n_models: int, rate: float, seed: int = 0) -> Workload:
    """The first `minutes` of the trace, its `n_models` busiest functions, thinned to about `rate`
    requests per real second at `speed` (see the package docstring)."""
    tr = load_azure_minute(trace_path, seed)
    window = tr.times < minutes * 60.0
    times, mids = tr.times[window], tr.mids[window]
    counts = np.bincount(mids, minlength=len(tr.models))
    order = [int(i) for i in np.argsort(-counts, kind="stable")[:n_models] if counts[i] > 0]
    if not order:
        raise ValueError(f"{trace_path}: no request in its first {minutes:g} minutes")
    n = counts[order].astype(float)
    span = minutes * 60.0 / speed
    budget = rate * span
    lo, hi = 0.0, float(n.max()) ** 0.75
    if np.minimum(n, hi * n**0.25).sum() > budget:
        for _ in range(60):  # c: kept requests = sum(min(1, c / n^0.75) * n) = budget
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.minimum(n, mid * n**0.25).sum() < budget else (lo, mid)
        keep = np.minimum(1.0, lo / n**0.75)
    else:
        keep = np.ones(len(order))
    rank = {m: i for i, m in enumerate(order)}
    rng = np.random.default_rng(seed)
    sel = np.array([rank.get(int(m), -1) for m in mids])
    chosen = sel >= 0
    p = np.where(chosen, keep[np.maximum(sel, 0)], 0.0)
    kept = chosen & (rng.random(len(sel)) < p)
    return Workload([f"{PREFIX}{i:02d}" for i in range(len(order))], [tr.models[m] for m in order],
                    times[kept] / speed, sel[kept].astype(np.int32), span, int(chosen.sum()))


def write_catalog(folder: Path, models: list[str]) -> Path:
    """Residual MLPs of SIZES_MIB (in order) under `folder`, once: a folder holding this set is reused."""
    from gpu_worker.demo_models import DemoModel, catalog_entry, write_weights

    specs = []
    for i, mid in enumerate(models):
        size = SIZES_MIB[i % len(SIZES_MIB)] << 20
        hidden = int(math.sqrt(size / 8))  # two hidden layers of hidden² float32 weights dominate
        specs.append(DemoModel(mid, "v1", "build_mlp", {"in_features": 64, "hidden": hidden, "depth": 2,
                                                        "classes": 10},
                               [{"shape": [1, 64], "dtype": "float32"}, {"shape": [8, 64], "dtype": "float32"}],
                               description=f"bench model of ~{size >> 20} MiB"))
    stamp = hashlib.sha256(json.dumps([[m.id, m.args] for m in specs]).encode()).hexdigest()
    catalog = folder / "catalog.toml"
    if catalog.exists() and (folder / ".stamp").exists() and (folder / ".stamp").read_text() == stamp:
        return catalog
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for m in specs:
        rel = f"{m.id}-{m.version}"
        entries.append(catalog_entry(m, f"{rel}/{write_weights(m, folder / rel)}"))
    catalog.write_text("\n".join(entries))
    (folder / ".stamp").write_text(stamp)
    return catalog
