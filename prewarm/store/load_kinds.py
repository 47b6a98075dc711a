"""Why each replica was loaded (keys.LOAD_KINDS: "<model>@<version>|<gpu>" -> "<actor>:<kind>"), kept by
the one dispatch path for the last preload sent to that GPU, so a warm hit can tell whether its replica
was loaded ahead of demand (the ROI's cold starts avoided)."""

from __future__ import annotations

import redis

from prewarm import keys
from prewarm.domain import action_kinds

# The scheduler's loads made before any request asked (prewarm.domain.action_kinds), as this record spells them
AHEAD_OF_DEMAND = tuple(f"scheduler:{kind}" for kind in sorted(action_kinds.AHEAD_OF_DEMAND))


def field(model: str, version: str, gpu: str) -> str:
    return f"{model}@{version}|{gpu}"


def note(r: redis.Redis | redis.client.Pipeline, model: str, version: str, gpu: str, actor: str, kind: str) -> None:
    r.hset(keys.LOAD_KINDS, field(model, version, gpu), f"{actor}:{kind}")


def read(r: redis.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(keys.LOAD_KINDS).items()}
