"""Noticing that the Redis master changed under us: a Sentinel failover (or a restart of the one Redis).

Each Redis process has its own `run_id` (INFO server). keys.REDIS_EPOCH holds the run id last seen; it is
written once and then replicated, so after a failover the new master still holds the old master's run id
there, and the first process to look (`observe`: the scheduler every tick, a worker when a task's intent is
missing) sees the two differ, swaps the new one in (compare-and-set, so one observer wins) and stamps
`failover_at`. What that time is for:

- the scheduler's leader holds evictions for one heartbeat TTL while workers re-announce, and re-sends the
  preloads whose tasks the failover lost (scheduler.failover);
- a worker runs a task whose intent vanished in the failover window instead of dropping it as stale
  (gpu_worker.intents): asynchronous replication can lose the intent and keep the task.

A Redis that lost everything (no epoch key) is simply a fresh start: nothing to compare with.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from prewarm import keys

_SWAP = """
local prev = redis.call('HGET', KEYS[1], 'run_id')
if prev == ARGV[2] then return 0 end
if (prev or '') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'run_id', ARGV[2])
if prev then redis.call('HSET', KEYS[1], 'failover_at', ARGV[3], 'previous', prev) end
return 1
"""
_swap = redis.commands.core.Script(None, _SWAP.encode())  # bytes: no client needed to hash it


@dataclass(frozen=True)
class Epoch:
    run_id: str  # the master's now
    failover_at: float | None  # when the run id last changed (None: never seen to)
    previous: str = ""  # the run id before that change


def observe(r: redis.Redis, now: float | None = None) -> Epoch:
    """The master's run id and the last failover seen, recording one if the run id changed. Two round trips
    when it did, one otherwise."""
    now = time.time() if now is None else now
    with r.pipeline(transaction=False) as p:
        p.info("server")
        p.hgetall(keys.REDIS_EPOCH)
        info, held = p.execute()
    run_id = str(info["run_id"])
    h = {k.decode(): v.decode() for k, v in held.items()}
    prev = h.get("run_id")
    if prev != run_id:
        _swap(keys=[keys.REDIS_EPOCH], args=[prev or "", run_id, f"{now:.3f}"], client=r)
        h = {k.decode(): v.decode() for k, v in r.hgetall(keys.REDIS_EPOCH).items()}
    at = h.get("failover_at")
    return Epoch(run_id, float(at) if at else None, h.get("previous", ""))


def recent(r: redis.Redis, within: float, now: float | None = None) -> Epoch | None:
    """The failover seen (or seen now) less than `within` seconds ago, if any."""
    now = time.time() if now is None else now
    e = observe(r, now)
    if e.failover_at is not None and now - e.failover_at < within:
        return e
    return None
