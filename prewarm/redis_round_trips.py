"""Counting a client's Redis round trips: every send on its connections (a command, a whole pipeline, a
health-check PING) is one request and one wait for the answer.

redis-py sends everything through `Connection.send_packed_command`, once per round trip, so a counting
subclass of the pool's connection class (the documented `connection_class` extension point) sees them
all. The scheduler reports its tick's round trips this way (prewarm_scheduler_redis_round_trips). Celery's
broker publishes use kombu's own connections and are not counted here.
"""

from __future__ import annotations

import threading
from typing import Any

import redis


class RoundTrips:
    """A thread-safe running count of round trips."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self._n += 1

    @property
    def value(self) -> int:
        return self._n


def count_round_trips(r: redis.Redis) -> RoundTrips:
    """Count `r`'s round trips from now on (idempotent: a client already counted keeps its counter). Its
    pool's idle connections are dropped so that every later send goes through a counting connection."""
    pool = r.connection_pool
    existing = getattr(pool.connection_class, "round_trips", None)
    if isinstance(existing, RoundTrips):
        return existing
    counter = RoundTrips()
    base = pool.connection_class

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        counter.add()
        base.send_packed_command(self, command, check_health)

    pool.connection_class = type(f"Counted{base.__name__}", (base,),
                                 {"send_packed_command": send_packed_command, "round_trips": counter})
    pool.reset()  # connections made before this are of the plain class
    return counter
