"""Why each replica was loaded (keys.LOAD_KINDS: "<model>@<version>|<gpu>" -> "<actor>:<kind>"), kept by
the one dispatch path for the last preload sent to that GPU, so a warm hit can tell whether its replica
was loaded ahead of demand (the ROI's cold starts avoided)."""

from __future__ import annotations

import redis

from prewarm import keys

# Loads the scheduler makes before any request asks: predicted demand, a new GPU's hottest models, and an
# extra replica for a rising rate, a LoRA adapter warmed in its base's slot (issue 29). (Demand, min_replicas,
# operator and router loads answer a request or a rule.)
AHEAD_OF_DEMAND = ("scheduler:speculative", "scheduler:new_gpu", "scheduler:scale", "scheduler:adapter")


def field(model: str, version: str, gpu: str) -> str:
    return f"{model}@{version}|{gpu}"


def note(r: redis.Redis | redis.client.Pipeline, model: str, version: str, gpu: str, actor: str, kind: str) -> None:
    r.hset(keys.LOAD_KINDS, field(model, version, gpu), f"{actor}:{kind}")


def read(r: redis.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(keys.LOAD_KINDS).items()}
