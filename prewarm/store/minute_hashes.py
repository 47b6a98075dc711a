"""The per-minute hashes' one read (keys.route_minute: lookup_counts; keys.memory_minute: memory_time): each field is
spelled `what:name`, each minute's hash expires after keys.MINUTE_TTL_S, and a window is the minutes it touches."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import redis

from prewarm.domain.slo import window_minutes


def read_fields(r: redis.Redis, key_of: Callable[[int], str], now: float,
                seconds: float) -> Iterator[tuple[str, str, bytes]]:
    """Every field of the minutes a window [now - seconds, now] touches (slo.window_minutes: whole minutes, the first
    one partly before it), in one round trip, as (what, name, raw value)."""
    pipe = r.pipeline(transaction=False)
    for m in window_minutes(now, seconds):
        pipe.hgetall(key_of(m))
    for raw in pipe.execute():
        for k, v in raw.items():
            what, _, name = k.decode().partition(":")
            yield what, name, v
