"""The traffic store: request counts per model in time buckets in Redis.

Written by the `/hooks/requests` hook, read by the scheduler (rates, trends, forecasts), the console
(rates, sparklines) and the metrics endpoint.

Layout (keys spelled in `prewarm.keys`):

- per-second buckets  `keys.traffic_bucket(1, t)`   hash model -> count, expiring ~15 min after the bucket
- per-minute buckets  `keys.traffic_bucket(60, t)`  hash model -> count, expiring ~8 days after the bucket
- `keys.REQUESTS_TOTAL` hash model -> count since the store began (never expires)
- `keys.LAST_REQUEST`   sorted set model -> Unix seconds of the newest event seen (as the score)

A bucket's key is named by its start (`t` is a multiple of the resolution), and a bucket hash only holds
the models that had requests in it, so a window over thousands of mostly idle models stays small.

Write API
    record(r, events, now=None) -> int
        `events` is an iterable of `(model, count, ts)` (ts in Unix seconds, or None for now). The whole
        batch is one call of a Lua script (`_RECORD_LUA`), which Redis runs atomically: all of it is
        recorded or none of it, and HINCRBY keeps the counts exact under any number of concurrent writers.
        One command with one JSON argument, rather than a MULTI/EXEC of a HINCRBY per model and bucket:
        the hook's cost was mostly redis-py packing and parsing those commands (and then, with one argument
        per value, redis-py packing each). Returns the number of requests recorded.
        Input is expected to be validated by the caller (the hook); a negative count raises ValueError.
    record_counts(r, counts, now) -> int
        The same for counts already aggregated, `{(ts, model): count}` (the hook's fast path builds it).

Read API (all cheap: one pipelined round trip of HGETALLs, one per bucket, whatever the model count)
    read_seconds(r, start, end, models=None) -> Window   per-second buckets covering [start, end)
    read_minutes(r, start, end, models=None) -> Window   per-minute buckets covering [start, end)
    read_window(r, resolution_s, start, end, models=None) -> Window
    recent(r, window_s, now=None, models=None) -> Window
        The last `window_s` seconds of *complete* buckets before `now` (the current partial second or
        minute is left out so a rate is not biased low). Seconds for windows up to 15 min, else minutes.
    rates(r, window_s, now=None, models=None) -> dict[model, requests per second]
    totals(r, models=None) -> dict[model, int]          requests since the store began
    last_requests(r, models=None) -> dict[model, float]  Unix seconds of each model's newest event

    Window.start         first bucket's start (Unix seconds, a multiple of resolution_s)
    Window.resolution_s  1 or 60
    Window.buckets       number of buckets
    Window.counts        dict model -> list[int], one count per bucket, oldest first (dense: zeros kept);
                         models with no request in the window are absent (`Window.series(m)` gives zeros)
    Window.times()       the bucket starts, oldest first
    Window.total(m), Window.rate(m)  requests in the window, and requests per second over it

The scheduler's typical tick: `w = traffic.recent(r, 600, now)` then `w.series(model)` for each model's
per-second counts over the last 10 minutes (index -1 is the newest complete second).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import redis

from prewarm import keys, replicated

SECOND = 1
MINUTE = 60
SECOND_TTL_S = 15 * 60  # fine buckets: the last minutes, for short-window rates and the panic window
MINUTE_TTL_S = 8 * 24 * 3600  # coarse buckets: the last days, for hourly/daily patterns
RETENTION_S = {SECOND: SECOND_TTL_S, MINUTE: MINUTE_TTL_S}
MAX_BUCKETS = 20_000  # a read spanning more buckets than this is refused rather than stalling Redis


def bucket_start(ts: float, resolution_s: int) -> int:
    return int(math.floor(ts / resolution_s)) * resolution_s


# KEYS: REQUESTS_TOTAL, LAST_REQUEST, then one traffic bucket per bucket in A.
# ARGV[1]: a JSON array of strings, A: for each bucket its expire_at and field count n, then n (model,
# count) pairs; the number of models in the totals, then their (model, count) pairs; then (newest_ts,
# model) pairs to the end, for ZADD GT (one call per 1,000). Numbers go as strings (a number Lua printed
# could come out as 1e+15, which HINCRBY refuses). One flat array rather than nested objects: no Lua
# table per bucket; one argument rather than one per value: redis-py packs each argument in Python, which
# for a batch of 1,000 events cost more than the rest of the hook.
# (Reading a bucket's fields with one HMGET and writing them with one HSET was measured no cheaper than
# a HINCRBY per field: Redis's time goes into the fields, not the calls.)
_RECORD_LUA = b"""
local A = cjson.decode(ARGV[1])
local function add(k, a, n)
  for j = a, a + 2 * n - 1, 2 do redis.call('HINCRBY', k, A[j], A[j + 1]) end
end
local a = 1
for i = 3, #KEYS do
  local n = tonumber(A[a + 1])
  add(KEYS[i], a + 2, n)
  redis.call('EXPIREAT', KEYS[i], A[a])
  a = a + 2 + 2 * n
end
local n = tonumber(A[a])
add(KEYS[1], a + 1, n)
a = a + 1 + 2 * n
while a <= #A do
  local b = math.min(a + 1999, #A)
  redis.call('ZADD', KEYS[2], 'GT', unpack(A, a, b))
  a = b + 1
end
return 1
"""
_record_script = redis.commands.core.Script(None, _RECORD_LUA)  # EVALSHA; loads itself on NOSCRIPT


def record(r: redis.Redis, events: Iterable[tuple[str, int, float | None]], now: float | None = None) -> int:
    now = time.time() if now is None else now
    # Aggregate first: a batch of 10,000 events for a few models becomes a few fields to add to.
    per_ts: dict[float, dict[str, int]] = {}
    for model, count, ts in events:
        if count < 0:
            raise ValueError(f"count for {model!r} is negative")
        t = now if ts is None else float(ts)
        per_model = per_ts.get(t)
        if per_model is None:
            per_model = per_ts[t] = {}
        per_model[model] = per_model.get(model, 0) + count
    return record_counts(r, per_ts, now)


def record_counts(r: redis.Redis, counts: Mapping[float, Mapping[str, int]], now: float) -> int:
    """Record requests already aggregated, `{ts: {model: count}}` (Unix seconds, counts >= 0; the hook's
    fast path builds this itself); one EVALSHA. Returns the number of requests recorded."""
    per_bucket: dict[tuple[int, int], dict[str, int]] = {}
    totals: dict[str, int] = {}
    newest: dict[str, float] = {}
    for t, per_model in counts.items():
        starts = [(res, start) for res in (SECOND, MINUTE)
                  if (start := bucket_start(t, res)) + res + RETENTION_S[res] > now]
        # (a bucket already past its retention is not written)
        for b in starts:
            in_bucket = per_bucket.get(b)
            if in_bucket is None:
                in_bucket = per_bucket[b] = {}
            for model, n in per_model.items():
                if n:
                    in_bucket[model] = in_bucket.get(model, 0) + n
        for model, n in per_model.items():
            totals[model] = totals.get(model, 0) + n
            if t > newest.get(model, -math.inf):
                newest[model] = t
    if not totals:
        return 0
    bucket_keys: list[str] = []
    args: list[str] = []
    for (res, start), in_bucket in per_bucket.items():
        if not in_bucket:
            continue
        bucket_keys.append(keys.traffic_bucket(res, start))
        # Expire relative to the bucket's own time, so late writes never extend a bucket's life.
        args += (str(start + res + RETENTION_S[res]), str(len(in_bucket)))
        for m, n in in_bucket.items():
            args += (m, str(n))
    counted = [(m, n) for m, n in totals.items() if n]
    args.append(str(len(counted)))
    for m, n in counted:
        args += (m, str(n))
    # ZADD GT: newest wins, so a delayed batch never moves a model's last request backwards.
    for m, t in newest.items():
        args += (f"{t:.3f}", m)
    # confirmed by PREWARM_REDIS_WAIT_REPLICAS replicas when set (prewarm.replicated): a 202 survives a failover
    replicated.run_script(r, _record_script, [keys.REQUESTS_TOTAL, keys.LAST_REQUEST, *bucket_keys],
                          [json.dumps(args, separators=(",", ":"))])
    return sum(totals.values())


@dataclass
class Window:
    start: int
    resolution_s: int
    buckets: int
    counts: dict[str, list[int]] = field(default_factory=dict)

    def times(self) -> list[int]:
        return [self.start + i * self.resolution_s for i in range(self.buckets)]

    @property
    def end(self) -> int:
        return self.start + self.buckets * self.resolution_s

    def series(self, model: str) -> list[int]:
        return self.counts.get(model) or [0] * self.buckets

    def total(self, model: str) -> int:
        return sum(self.counts.get(model, ()))

    def rate(self, model: str) -> float:
        span = self.buckets * self.resolution_s
        return self.total(model) / span if span else 0.0

    def rates(self) -> dict[str, float]:
        return {m: self.rate(m) for m in self.counts}


def read_window(r: redis.Redis, resolution_s: int, start: float, end: float,
                models: Iterable[str] | None = None) -> Window:
    """Buckets of `resolution_s` covering [start, end): the bucket holding `start` up to the one before
    the bucket holding `end` (so `end` = now excludes the current partial bucket)."""
    if resolution_s not in RETENTION_S:
        raise ValueError(f"resolution_s must be one of {sorted(RETENTION_S)}")
    first = bucket_start(start, resolution_s)
    last = bucket_start(end, resolution_s)
    n = max(0, (last - first) // resolution_s)
    if n > MAX_BUCKETS:
        raise ValueError(f"window of {n} buckets is too long (at most {MAX_BUCKETS}); use coarser buckets")
    wanted = set(models) if models is not None else None
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.hgetall(keys.traffic_bucket(resolution_s, first + i * resolution_s))
    counts: dict[str, list[int]] = {}
    for i, h in enumerate(pipe.execute() if n else []):
        for raw_model, raw_count in h.items():
            model = raw_model.decode()
            if wanted is not None and model not in wanted:
                continue
            series = counts.get(model)
            if series is None:
                series = counts[model] = [0] * n
            series[i] = int(raw_count)
    return Window(start=first, resolution_s=resolution_s, buckets=n, counts=counts)


def read_seconds(r: redis.Redis, start: float, end: float, models: Iterable[str] | None = None) -> Window:
    return read_window(r, SECOND, start, end, models)


def read_minutes(r: redis.Redis, start: float, end: float, models: Iterable[str] | None = None) -> Window:
    return read_window(r, MINUTE, start, end, models)


def recent(r: redis.Redis, window_s: float, now: float | None = None,
           models: Iterable[str] | None = None) -> Window:
    now = time.time() if now is None else now
    res = SECOND if window_s <= SECOND_TTL_S else MINUTE
    end = bucket_start(now, res)  # exclude the current, partial bucket
    return read_window(r, res, end - window_s, end, models)


def rates(r: redis.Redis, window_s: float, now: float | None = None,
          models: Iterable[str] | None = None) -> dict[str, float]:
    return recent(r, window_s, now, models).rates()


def totals(r: redis.Redis, models: Iterable[str] | None = None) -> dict[str, int]:
    wanted = set(models) if models is not None else None
    return {k.decode(): int(v) for k, v in r.hgetall(keys.REQUESTS_TOTAL).items()
            if wanted is None or k.decode() in wanted}


def last_requests(r: redis.Redis, models: Iterable[str] | None = None) -> dict[str, float]:
    wanted = set(models) if models is not None else None
    return {k.decode(): float(t) for k, t in r.zrange(keys.LAST_REQUEST, 0, -1, withscores=True)
            if wanted is None or k.decode() in wanted}
