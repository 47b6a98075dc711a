"""Measured load+warmup seconds per model: the worker records each preload, the scheduler plans with their
median and the API shows their p95, over the same most recent KEPT measurements.

Loads from storage and promotions from a node's host cache (source "host") are kept apart, so a fast
promotion does not shorten the cold-load time the scheduler plans with.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import redis
from redis.client import Pipeline

from prewarm import keys, state

KEPT = 20  # measurements kept per model and list: the most recent ones, newest first


def push(pipe: Pipeline, replica: state.Replica) -> None:
    """Queue the ready replica's load+warmup seconds on `pipe` (its list trimmed to KEPT)."""
    key = keys.promote_times(replica.model) if replica.source == "host" else keys.load_times(replica.model)
    total = (replica.load_seconds or 0.0) + (replica.warmup_seconds or 0.0)
    pipe.lpush(key, f"{total:.4f}")
    pipe.ltrim(key, 0, KEPT - 1)


@dataclass
class Measured:
    load: list[float] = field(default_factory=list)  # from storage, newest first
    promote: list[float] = field(default_factory=list)  # from a host cache, newest first


def _numbers(raw: list[bytes]) -> list[float]:
    try:
        return [float(x) for x in raw]
    except ValueError:
        return []  # a corrupt entry: read as unmeasured rather than fail the reader


def recent(r: redis.Redis, models: list[str]) -> dict[str, Measured]:
    """model -> its most recent measurements (empty lists when never measured), in one round trip."""
    pipe = r.pipeline(transaction=False)
    for m in models:
        pipe.lrange(keys.load_times(m), 0, KEPT - 1)
        pipe.lrange(keys.promote_times(m), 0, KEPT - 1)
    raw = pipe.execute()
    return {m: Measured(_numbers(raw[2 * i]), _numbers(raw[2 * i + 1])) for i, m in enumerate(models)}


def medians(r: redis.Redis, models: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Median of the recent loads from storage and of the promotions from a host cache, per model (a model
    never measured, or with a corrupt entry, is absent), in one round trip: what the scheduler plans with
    and the route hook's ETA promises."""
    load: dict[str, float] = {}
    promote: dict[str, float] = {}
    for m, x in recent(r, models).items():
        for out, nums in ((load, x.load), (promote, x.promote)):
            if nums:
                out[m] = statistics.median(nums)
    return load, promote
