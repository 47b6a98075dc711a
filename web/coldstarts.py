"""Cold-start bookkeeping shared by every web process through Redis.

A cold start opens when a route lookup finds no ready replica of a model (HSETNX on keys.COLD_STARTS,
so one episode is counted once however many lookups see it) and closes when a replica of that version
is ready. Whichever process first notices the ready replica closes it (HDEL returning 1 decides), so
the duration histogram gets each cold start exactly once. The duration runs to the moment the replica
became ready (its `since`), not to when it was noticed.

Model load and warmup times are put into their histograms the same way: the worker records them on the
replica, and the first web process to see the ready replica (at a /metrics scrape) claims it in Redis.
"""

from __future__ import annotations

import json
import time

import redis

from prewarm import keys, state
from web import metrics

ABANDON_AFTER_S = 3600.0  # an episode never served within an hour (failed loads) is dropped uncounted


def open_cold_start(r: redis.Redis, model: str, version: str, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    rec = json.dumps({"seen_at": now, "version": version})
    if r.hsetnx(keys.COLD_STARTS, model, rec):
        metrics.COLD_STARTS.labels(model).inc()
        return True
    return False


def close_cold_starts(r: redis.Redis, fleet: state.Fleet, models: list[str] | None = None,
                      now: float | None = None) -> dict[str, float]:
    """Close open cold starts whose model now has a ready replica; returns model -> seconds closed here."""
    now = time.time() if now is None else now
    if models is None:
        raw = {k.decode(): v for k, v in r.hgetall(keys.COLD_STARTS).items()}
    else:
        raw = {m: v for m, v in zip(models, r.hmget(keys.COLD_STARTS, models) if models else [],
                                       strict=True) if v}
    closed: dict[str, float] = {}
    for model, value in raw.items():
        try:
            rec = json.loads(value)
            seen_at, version = float(rec["seen_at"]), str(rec["version"])
        except (ValueError, KeyError, TypeError):
            r.hdel(keys.COLD_STARTS, model)  # unreadable: drop rather than block future episodes
            continue
        ready = [x for x in fleet.replicas(model) if x.state == "ready" and x.version == version]
        if not ready:
            if now - seen_at > ABANDON_AFTER_S:
                r.hdel(keys.COLD_STARTS, model)
            continue
        if r.hdel(keys.COLD_STARTS, model) != 1:
            continue  # another process closed it first
        ready_at = min((x.since for x in ready if x.since >= seen_at), default=seen_at)
        seconds = max(0.0, ready_at - seen_at)
        metrics.COLD_START_DURATION.observe(seconds)
        r.hset(keys.LAST_COLD_START, model, f"{seconds:.3f}")
        closed[model] = seconds
    return closed


def open_models(r: redis.Redis) -> dict[str, float]:
    """model -> seen_at of each open cold start."""
    out = {}
    for k, v in r.hgetall(keys.COLD_STARTS).items():
        try:
            out[k.decode()] = float(json.loads(v)["seen_at"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def last_durations(r: redis.Redis) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in r.hgetall(keys.LAST_COLD_START).items()}


# Claim replicas whose load has not been observed yet: ARGV is field, created_at pairs; returns the
# indexes (1-based pair numbers) newly claimed. Atomic, so two web processes never observe one load twice.
_CLAIM_LOADS = """
local out = {}
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) ~= ARGV[i + 1] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    table.insert(out, (i + 1) / 2)
  end
end
return out
"""


def observe_loads(r: redis.Redis, fleet: state.Fleet) -> int:
    """Put each newly ready replica's measured load and warmup seconds into the histograms, once."""
    done = [x for x in fleet.replicas() if x.state == "ready" and x.load_seconds is not None]
    if not done:
        return 0
    argv: list[str] = []
    for x in done:
        argv += [f"{x.gpu}|{x.model}@{x.version}", f"{x.created_at:.6f}"]
    claimed = r.eval(_CLAIM_LOADS, 1, keys.OBSERVED_LOADS, *argv)
    for n in claimed:
        x = done[int(n) - 1]
        metrics.MODEL_LOAD.observe(float(x.load_seconds or 0.0))
        if x.warmup_seconds is not None:
            metrics.MODEL_WARMUP.observe(float(x.warmup_seconds))
    return len(claimed)
