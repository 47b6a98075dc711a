"""What keeping models warm costs and buys, per model over a window (GET /api/roi, the console's ROI page):
GPU memory-time held (prewarm.store.memory_time, accounted by the leader scheduler each tick), warm hits
and cold starts (prewarm.store.lookup_counts, counted by the route hook), cold starts avoided (warm hits
on a replica the scheduler loaded ahead of demand: speculatively, for a new GPU, or for a rising rate,
before any request asked; prewarm.store.load_kinds), and the memory's cost at PREWARM_GPU_HOUR_COST per
GPU-hour (a replica holding a share of a GPU's memory costs that share of its hour).
"""

from __future__ import annotations

from typing import Any

import redis

from prewarm import keys
from prewarm.catalog_entries import Catalog
from prewarm.store import lookup_counts, memory_time
from prewarm.units import GIB

MAX_WINDOW_S = keys.MINUTE_TTL_S - 3600  # the per-minute records live a little longer than this


def report(r: redis.Redis, catalog: Catalog, now: float, window_s: int, gpu_hour_cost: float) -> dict[str, Any]:
    """{"window_seconds", "gpu_hour_cost", "models": [{"id", "gpu_memory_gib_hours", "warm_hits",
    "cold_starts", "cold_starts_avoided", "cost"}], "totals": {...}}: the catalog's models and any other
    seen in the window, the most memory-time first."""
    counts = lookup_counts.read_window(r, now, window_s)
    held = memory_time.read_window(r, now, window_s)
    ids = list(dict.fromkeys([*catalog.ids(), *sorted(counts.per_model), *sorted(held.byte_seconds)]))
    rows = []
    for m in ids:
        c = counts.per_model.get(m, {})
        rows.append({"id": m, "gpu_memory_gib_hours": round(held.byte_seconds.get(m, 0.0) / GIB / 3600, 6),
                     "warm_hits": c.get(lookup_counts.READY, 0), "cold_starts": c.get(lookup_counts.COLD_START, 0),
                     "cold_starts_avoided": c.get(lookup_counts.AVOIDED, 0),
                     "cost": round(held.gpu_seconds.get(m, 0.0) / 3600 * gpu_hour_cost, 6)})
    rows.sort(key=lambda x: (-x["gpu_memory_gib_hours"], x["id"]))
    totals = {k: round(sum(x[k] for x in rows), 6) for k in ("gpu_memory_gib_hours", "cost")}
    totals.update({k: sum(x[k] for x in rows) for k in ("warm_hits", "cold_starts", "cold_starts_avoided")})
    return {"window_seconds": window_s, "gpu_hour_cost": gpu_hour_cost, "models": rows, "totals": totals}
