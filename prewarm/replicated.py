"""Writes acknowledged only once a replica holds them (PREWARM_REDIS_WAIT_REPLICAS), for what a failover must
not lose.

Redis replicates asynchronously: a write the master acknowledged and had not yet sent to its replica when it
died is gone after Sentinel promotes that replica. For the hook's traffic counts (a router was answered 202,
so it will not resend them) that is a lost acknowledged write. With `PREWARM_REDIS_WAIT_REPLICAS=N` the write
and a `WAIT N timeout` go down one connection in one round trip (WAIT counts the writes of its own
connection), and the write is acknowledged only when N replicas have it; otherwise the caller gets a
`NotReplicated` (a redis.ConnectionError: the hook answers 503 with Retry-After and the router resends, at
the price of counting that batch twice if the master did keep it). 0 (the default): no WAIT, no extra cost.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import redis
from redis.commands.core import Script

WAIT_TIMEOUT_MS = 1000  # a replica that has not confirmed within this is treated as gone (the hook's 503)

_wanted: weakref.WeakKeyDictionary[redis.Redis, int] = weakref.WeakKeyDictionary()


class NotReplicated(redis.ConnectionError):
    """The master took the write, but fewer replicas than asked confirmed it in time."""


def require(r: redis.Redis, replicas: int) -> redis.Redis:
    """Ask for `replicas` confirmations on the writes made through `write` with this client."""
    if replicas > 0:
        _wanted[r] = replicas
    else:
        _wanted.pop(r, None)
    return r


def wanted(r: redis.Redis) -> int:
    return _wanted.get(r, 0)


def run_script(r: redis.Redis, script: Script, keys: Sequence[str], args: Sequence[object]) -> object:
    """`script(keys, args)`, confirmed by `wanted(r)` replicas when that is above 0."""
    n = wanted(r)
    if not n:
        return script(keys=list(keys), args=list(args), client=r)
    for attempt in (1, 2):
        with r.pipeline(transaction=False) as p:
            p.evalsha(script.sha, len(keys), *keys, *args)
            p.execute_command("WAIT", n, WAIT_TIMEOUT_MS)
            try:
                result, acked = p.execute()
            except redis.exceptions.NoScriptError:  # a new master (a failover, a restart): load it, once
                if attempt == 2:
                    raise
                r.script_load(script.script)
                continue
        if int(acked) < n:
            raise NotReplicated(f"the write reached {acked} of {n} replica(s) within {WAIT_TIMEOUT_MS} ms "
                                "(PREWARM_REDIS_WAIT_REPLICAS); not acknowledged")
        return result
    raise AssertionError("unreachable")
