"""The cold-start SLO controller's state (keys.SLO_STATE), written by the leader scheduler each tick: a
new leader carries on at the same level, and the console and API show the line and the current budget."""

from __future__ import annotations

import json
import math
from typing import Any

import redis

from prewarm import keys


def write(r: redis.Redis, record: dict[str, Any]) -> None:
    r.set(keys.SLO_STATE, json.dumps(record, separators=(",", ":")))


def read(r: redis.Redis) -> dict[str, Any] | None:
    """The last record, or None (no SLO set, or no leader has ticked with one)."""
    raw = r.get(keys.SLO_STATE)
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def finite(x: float | None) -> float | None:
    """JSON has no infinity: a never-changed time reads as None."""
    return None if x is None or not math.isfinite(x) else x
