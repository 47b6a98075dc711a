"""Actions dispatched, per action and kind (keys.DISPATCH_COUNTS: "<action>:<kind>" -> count): counted by
the one dispatch path, exposed as prewarm_preloads_total{reason} and its siblings."""

from __future__ import annotations

import redis

from prewarm import keys

UNSPECIFIED = "unspecified"  # an action dispatched with no kind


def count(r: redis.Redis | redis.client.Pipeline, action: str, kind: str) -> None:
    r.hincrby(keys.DISPATCH_COUNTS, f"{action}:{kind or UNSPECIFIED}", 1)


def read(r: redis.Redis) -> dict[tuple[str, str], int]:
    """(action, kind) -> actions dispatched, sorted."""
    out = {}
    for field, n in sorted(r.hgetall(keys.DISPATCH_COUNTS).items()):
        action, _, kind = field.decode().partition(":")
        out[(action, kind or UNSPECIFIED)] = int(n)
    return out
