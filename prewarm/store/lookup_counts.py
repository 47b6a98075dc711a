"""Per-minute route lookup outcomes per model (keys.route_minute): what the cold-start SLO controller
measures its window on and /api/roi reports, counted where they happen.

- the route hook counts each lookup that is a request (not a router's retry poll): ready or not, and
  whether the ready replica it named was loaded ahead of demand (prewarm.store.load_kinds), in one call;
- a cold-start episode opening counts in its minute (prewarm.store.cold_starts' open);
- a cold start completing counts its duration's histogram bucket in its minute (the same close that
  observes prewarm_cold_start_duration_seconds), for the window's p95.
Each minute's hash expires after keys.MINUTE_TTL_S. Reads only read.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import redis
from redis.client import Pipeline

from prewarm import keys, metrics_defs
from prewarm.domain.slo import minute_of
from prewarm.store import load_kinds, minute_hashes

READY, NOT_READY, AVOIDED, COLD_START, DURATION = "ready", "not_ready", "avoided", "cold_start", "dur"


# KEYS: the minute's hash, LOAD_KINDS. ARGV: model, ready (1/0), load-kind field, ttl, ahead-of-demand kinds...
_COUNT = """
if ARGV[2] == '1' then
  redis.call('HINCRBY', KEYS[1], 'ready:' .. ARGV[1], 1)
  local kind = redis.call('HGET', KEYS[2], ARGV[3])
  if kind then
    for i = 5, #ARGV do
      if kind == ARGV[i] then redis.call('HINCRBY', KEYS[1], 'avoided:' .. ARGV[1], 1) break end
    end
  end
else
  redis.call('HINCRBY', KEYS[1], 'not_ready:' .. ARGV[1], 1)
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


def count_lookup(r: redis.Redis, model: str, ready_on: tuple[str, str, str] | None, now: float) -> None:
    """One lookup that is a request: answered ready on (model, version, gpu) `ready_on`, or not ready (None)."""
    kind_field = load_kinds.field(*ready_on) if ready_on else ""
    r.eval(_COUNT, 2, keys.route_minute(minute_of(now)), keys.LOAD_KINDS, model, "1" if ready_on else "0",
           kind_field, keys.MINUTE_TTL_S, *load_kinds.AHEAD_OF_DEMAND)


def queue_duration(pipe: Pipeline, seconds: float, now: float) -> None:
    """Queue a completed cold start's duration (its histogram bucket) in the minute it completed."""
    key = keys.route_minute(minute_of(now))
    bound = metrics_defs.COLD_START_DURATION.bucket_of(seconds)
    pipe.hincrby(key, f"{DURATION}:{'+Inf' if math.isinf(bound) else repr(bound)}", 1)
    pipe.expire(key, keys.MINUTE_TTL_S)


@dataclass
class Window:
    """Sums over a window's minutes: per model, and the cold starts' durations by bucket bound."""

    per_model: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    durations: dict[float, int] = field(default_factory=lambda: defaultdict(int))

    def total(self, what: str) -> int:
        return sum(m.get(what, 0) for m in self.per_model.values())

    def p95_seconds(self) -> float | None:
        """The 95th percentile cold-start duration, as the upper bound of its bucket (None: none completed)."""
        return metrics_defs.COLD_START_DURATION.quantile_bound(self.durations, 0.95)


def read_window(r: redis.Redis, now: float, seconds: float) -> Window:
    """The minutes from now - seconds to now (whole minutes: the first one partly before), one round trip."""
    w = Window()
    for what, name, v in minute_hashes.read_fields(r, keys.route_minute, now, seconds):
        if what == DURATION:
            w.durations[float(name)] += int(v)
        else:
            w.per_model[name][what] += int(v)
    return w
