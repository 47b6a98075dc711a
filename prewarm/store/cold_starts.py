"""Cold-start episodes (keys.COLD_STARTS: model -> JSON {seen_at, version}; keys.LAST_COLD_START).

An episode opens when a route lookup finds no ready replica of a model (one per model however many
lookups see it) and closes when a replica of that version turns ready: the worker closes it at that
moment (prewarm.store.ready), and a route lookup that notices the ready replica may close it too. The
close is a compare-and-delete in a MULTI/EXEC watched on the record, so whichever comes first counts it,
exactly once, in prewarm_cold_start_duration_seconds; the duration runs to the moment the replica became
ready, not to when it was noticed. An episode left open for ABANDON_AFTER_S (its loads kept failing) is
over, uncounted: the next lookup opens a new one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis
from redis.client import Pipeline

from prewarm import keys, metrics_defs, state
from prewarm.domain import states as rs
from prewarm.store import histograms, lookup_counts

ABANDON_AFTER_S = 3600.0


@dataclass(frozen=True)
class ColdStart:
    model: str
    version: str
    seen_at: float  # the first lookup that found it cold

    def to_json(self) -> str:
        return json.dumps({"seen_at": self.seen_at, "version": self.version})

    @classmethod
    def parse(cls, model: str, raw: bytes | str | None) -> ColdStart | None:
        """The record, or None when absent or unreadable."""
        if raw is None:
            return None
        try:
            rec = json.loads(raw)
            return cls(model, str(rec["version"]), float(rec["seen_at"]))
        except (ValueError, KeyError, TypeError):
            return None


def unless_outstanding(time_field: str, now: str, max_age: str) -> str:
    """The start of a Lua script that returns 0 when field ARGV[1] of hash KEYS[1] holds a JSON record whose
    `time_field` is at most `max_age` seconds before `now` (Lua expressions), and else goes on: the one rule
    "a record still outstanding blocks a new one" for cold-start episodes and ETA promises. An unreadable
    record counts as absent."""
    return f"""
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local ok, rec = pcall(cjson.decode, cur)
  local at = ok and type(rec) == 'table' and tonumber(rec['{time_field}'])
  if at and tonumber({now}) - at <= tonumber({max_age}) then return 0 end
end
"""


# Open unless an episode of the model is open and younger than ARGV[4] seconds, and count the opening in its
# minute (KEYS[2], prewarm.store.lookup_counts): one Lua call, so the route hook pays one round trip. (This
# reads seen_at in Lua; ColdStart.parse is the Python reader.)
_OPEN = unless_outstanding("seen_at", "ARGV[3]", "ARGV[4]") + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], 'cold_start:' .. ARGV[1], 1)
redis.call('EXPIRE', KEYS[2], ARGV[5])
return 1
"""


def open_episode(r: redis.Redis, model: str, version: str, now: float | None = None) -> bool:
    """Open an episode for `model` at `version`; True when this call opened it (a new episode)."""
    now = time.time() if now is None else now
    rec = ColdStart(model, version, now)
    return bool(r.eval(_OPEN, 2, keys.COLD_STARTS, keys.route_minute(lookup_counts.minute_of(now)), model,
                       rec.to_json(), repr(now), repr(ABANDON_AFTER_S), keys.MINUTE_TTL_S))


def read_open(r: redis.Redis, now: float | None = None) -> dict[str, ColdStart]:
    """model -> its open episode (abandoned and unreadable records left out). Read only."""
    now = time.time() if now is None else now
    out = {}
    for k, v in r.hgetall(keys.COLD_STARTS).items():
        c = ColdStart.parse(k.decode(), v)
        if c is not None and now - c.seen_at <= ABANDON_AFTER_S:
            out[c.model] = c
    return out


def last_durations(r: redis.Redis) -> dict[str, float]:
    """model -> seconds of its last completed cold start."""
    return {k.decode(): float(v) for k, v in r.hgetall(keys.LAST_COLD_START).items()}


@dataclass(frozen=True)
class Closing:
    """What a replica turning ready does to an open episode: count it (seconds), or drop it uncounted."""

    model: str
    seconds: float | None  # None: dropped uncounted (unreadable, or abandoned long before)

    def queue(self, pipe: Pipeline) -> None:
        """Queue the close on `pipe` (after MULTI)."""
        pipe.hdel(keys.COLD_STARTS, self.model)
        if self.seconds is not None:
            histograms.observe(pipe, metrics_defs.COLD_START_DURATION, self.seconds)
            lookup_counts.queue_duration(pipe, self.seconds, time.time())
            pipe.hset(keys.LAST_COLD_START, self.model, f"{self.seconds:.3f}")


def closing(pipe: Pipeline, model: str, version: str, ready_at: float,
            seen_at: float | None = None) -> Closing | None:
    """In a transaction watching keys.COLD_STARTS, before its MULTI: how a replica of `version` that turned
    ready at `ready_at` closes `model`'s episode; None when it does not: none open, another version, or an
    episode that opened after that replica was ready (or, given `seen_at`, not the episode the caller saw)."""
    raw = pipe.hget(keys.COLD_STARTS, model)
    if raw is None:
        return None
    c = ColdStart.parse(model, raw)
    if c is None:
        return Closing(model, None)
    if c.version != version or ready_at < c.seen_at or seen_at not in (None, c.seen_at):
        return None
    if ready_at - c.seen_at > ABANDON_AFTER_S:
        return Closing(model, None)
    return Closing(model, max(0.0, ready_at - c.seen_at))


def _close(r: redis.Redis, model: str, version: str, ready_at: float,
           seen_at: float | None) -> float | None:
    def txn(pipe: Pipeline) -> float | None:
        c = closing(pipe, model, version, ready_at, seen_at)
        pipe.multi()
        if c is not None:
            c.queue(pipe)
        return c.seconds if c is not None else None

    # Retried if the record changes between the read and EXEC: then whoever changed it decided.
    return r.transaction(txn, keys.COLD_STARTS, value_from_callable=True)


def close_ready(r: redis.Redis, fleet: state.Fleet, models: list[str] | None = None,
                now: float | None = None) -> dict[str, float]:
    """Close the open episodes (of `models`, default all) whose version has a ready replica in `fleet`;
    drop those abandoned. Returns model -> seconds counted by this call."""
    now = time.time() if now is None else now
    if models is None:
        raw = {k.decode(): v for k, v in r.hgetall(keys.COLD_STARTS).items()}
    else:
        raw = {m: v for m, v in zip(models, r.hmget(keys.COLD_STARTS, models) if models else [],
                                       strict=True) if v}
    closed: dict[str, float] = {}
    for model, value in raw.items():
        c = ColdStart.parse(model, value)
        if c is None:
            _close(r, model, "", now, None)  # unreadable: dropped rather than block future episodes
            continue
        ready = [x for x in fleet.replicas(model) if x.state == rs.READY and x.version == c.version]
        if not ready:
            if now - c.seen_at > ABANDON_AFTER_S:
                _close(r, model, c.version, now, c.seen_at)  # nothing ready within ABANDON_AFTER_S: dropped
            continue
        ready_at = min((x.since for x in ready if x.since >= c.seen_at), default=c.seen_at)
        seconds = _close(r, model, c.version, ready_at, c.seen_at)  # only the episode this fleet read ends
        if seconds is not None:
            closed[model] = seconds
    return closed
