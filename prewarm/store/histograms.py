"""Redis-backed histograms: events observed in whichever process they happen in (the worker, the route
hook), counted once in Redis, and exposed at scrape time by every web process alike.

One hash per histogram (keys.histogram(name)): one field per bucket bound ("0.5", "+Inf") counting the
events in that bucket only (an observation increments one field, not every larger one), and "sum".
`observe` queues its commands on the caller's pipeline, so the histogram moves in the same MULTI/EXEC as
the record it belongs to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis
from redis.client import Pipeline

from prewarm import keys
from prewarm.metrics_defs import HistogramDef

SUM = "sum"


def _field(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


def observe(pipe: Pipeline, d: HistogramDef, value: float) -> None:
    """Queue one observation of `value` (seconds) on `pipe`."""
    key = keys.histogram(d.name)
    pipe.hincrby(key, _field(d.bucket_of(value)), 1)
    pipe.hincrbyfloat(key, SUM, float(value))


@dataclass(frozen=True)
class Counts:
    """A histogram as Prometheus shows it: cumulative counts per bound (+Inf last), and the sum."""

    buckets: list[tuple[float, int]]
    sum: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1]


def read(r: redis.Redis, defs: tuple[HistogramDef, ...]) -> dict[str, Counts]:
    """name -> counts of each histogram, in one round trip (read only)."""
    pipe = r.pipeline(transaction=False)
    for d in defs:
        pipe.hgetall(keys.histogram(d.name))
    out = {}
    for d, raw in zip(defs, pipe.execute(), strict=True):
        fields = {k.decode(): v for k, v in raw.items()}
        running, buckets = 0, []
        for bound in d.bounds():
            running += int(fields.get(_field(bound), 0))
            buckets.append((bound, running))
        out[d.name] = Counts(buckets, float(fields.get(SUM, 0.0)))
    return out
