"""The policy the leader scheduler runs (keys.SCHEDULER_POLICY: {name, since, scheduler}): written when a
scheduler takes the lead, read by /api/fleet and the console; and, from the leader's status
(keys.SCHEDULER_STATUS, written each tick), what its no-regret layer and loads-ahead record say now."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from prewarm import keys


@dataclass(frozen=True)
class Running:
    name: str
    since: float
    scheduler: str


def swap(r: redis.Redis, name: str, scheduler: str, now: float | None = None) -> Running | None:
    """Record `name` as the running policy; returns the record it replaced (None: none yet). The same name
    again keeps its `since`."""
    now = time.time() if now is None else now
    before = running(r)
    since = before.since if before is not None and before.name == name else now
    r.hset(keys.SCHEDULER_POLICY, mapping={"name": name, "since": f"{since:.3f}", "scheduler": scheduler})
    return before


def running(r: redis.Redis) -> Running | None:
    h = {k.decode(): v.decode(errors="replace") for k, v in r.hgetall(keys.SCHEDULER_POLICY).items()}
    if not h.get("name"):
        return None
    try:
        since = float(h.get("since") or 0.0)
    except ValueError:
        since = 0.0
    return Running(h["name"], since, h.get("scheduler", ""))


JUDGEMENTS = ("expert", "loads_ahead", "fills", "link_waits", "stale_rates")


def judgement(r: redis.Redis) -> dict[str, str]:
    """What the leader wrote at its last tick, by JUDGEMENTS' names: which expert's eviction order leads and why,
    whether loads ahead go on and why, whether fills take all free memory and why, which demand loads wait for a
    busy link, whether a silent model's measured rate is refuted and why; "" each where its policy has no such
    record (or no tick yet)."""
    got = r.hmget(keys.SCHEDULER_STATUS, list(JUDGEMENTS))
    return {k: (v or b"").decode(errors="replace") for k, v in zip(JUDGEMENTS, got, strict=True)}
