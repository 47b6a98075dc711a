"""The route hook's side of cold starts: an episode it opens is counted in prewarm_cold_starts_total (a
web-process counter); the episode record, its closing and its duration belong to prewarm.store.cold_starts.

The worker closes an episode when the replica turns ready; a lookup that notices a ready replica first
may close it too (exactly once either way).
"""

from __future__ import annotations

import redis

from prewarm.store import cold_starts
from web import metrics


def open_cold_start(r: redis.Redis, model: str, version: str, now: float | None = None) -> bool:
    """Open an episode; True (and counted) when this lookup opened a new one."""
    if cold_starts.open_episode(r, model, version, now):
        metrics.COLD_STARTS.labels(model).inc()
        return True
    return False

