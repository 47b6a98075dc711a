"""Catalog overlays: operator pins (keys.PINNED) and announced rollouts (keys.ROLLOUTS).

A pin here is on top of the catalog's own `pinned`; a rollout asks the scheduler to warm `version` for
`traffic_fraction` of the model's traffic before the router shifts it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import redis
from redis.client import Pipeline

from prewarm import keys


# --- pins -----------------------------------------------------------------------------------------
def set_pinned(r: redis.Redis | Pipeline, model: str, pinned: bool) -> None:
    if pinned:
        r.sadd(keys.PINNED, model)
    else:
        r.srem(keys.PINNED, model)


def pinned(r: redis.Redis) -> set[str]:
    """The models an operator pinned."""
    return {x.decode() for x in r.smembers(keys.PINNED)}


# --- rollouts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rollout:
    version: str
    traffic_fraction: float
    since: float
    from_version: str | None = None  # the catalog's current version when it was announced

    def public(self) -> dict[str, Any]:
        """The record as the rollout hook answers it."""
        return asdict(self)


def announce(pipe: redis.Redis | Pipeline, model: str, rollout: Rollout) -> None:
    """Write (or replace) the model's rollout; `pipe` may be the caller's transaction."""
    pipe.hset(keys.ROLLOUTS, model, json.dumps(rollout.public()))


def rollouts(r: redis.Redis) -> dict[str, Rollout]:
    """model -> its announced rollout (an unreadable record is left out)."""
    out = {}
    for k, v in r.hgetall(keys.ROLLOUTS).items():
        try:
            d = json.loads(v)
            out[k.decode()] = Rollout(version=str(d["version"]), traffic_fraction=float(d.get("traffic_fraction", 0)),
                                      since=float(d.get("since", 0.0)), from_version=d.get("from_version"))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out
