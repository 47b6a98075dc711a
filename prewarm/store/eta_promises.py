"""ETA promises (keys.ETA_PROMISES: "<model>@<version>" -> JSON {at, eta}) and how well they held.

The route hook records the first ETA it gives for a model@version that has no ready replica (a router
polling every second does not move the promise it first acted on); the replica turning ready
(prewarm.store.ready, in its MULTI/EXEC) closes it and observes real − promised seconds in
prewarm_route_eta_error_seconds. A promise older than ABANDON_AFTER_S (its loads kept failing) is dropped
uncounted, like an abandoned cold start. The last KEPT closed promises are also kept one by one
(keys.ETA_ERRORS) so that `GET /api/eta` can give their exact median and p95, which the histogram's
buckets only bound.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline

from prewarm import keys, metrics_defs, state
from prewarm.store import histograms
from prewarm.store.cold_starts import ABANDON_AFTER_S, unless_outstanding

KEPT = 1000  # closed promises kept one by one, newest first


@dataclass(frozen=True)
class Promise:
    at: float  # when the route hook gave it
    eta: float  # seconds to ready it promised

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Promise | None:
        if raw is None:
            return None
        try:
            rec = json.loads(raw)
            return cls(float(rec["at"]), float(rec["eta"]))
        except (ValueError, KeyError, TypeError):
            return None


# Record unless a promise younger than ARGV[3] seconds is outstanding: one round trip for the route hook.
_PROMISE = unless_outstanding("at", "ARGV[4]", "ARGV[3]") + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


def promise(r: redis.Redis, model: str, version: str, eta: float, now: float | None = None) -> bool:
    """Record an ETA given for model@version unless one is outstanding; True when this one was recorded."""
    now = time.time() if now is None else now
    rec = json.dumps({"at": round(now, 3), "eta": round(eta, 3)})
    return bool(r.eval(_PROMISE, 1, keys.ETA_PROMISES, state.replica_field(model, version), rec,
                       repr(ABANDON_AFTER_S), repr(now)))


def read(r: redis.Redis) -> dict[str, Promise]:
    """"<model>@<version>" -> its outstanding promise (read only)."""
    out = {}
    for k, v in r.hgetall(keys.ETA_PROMISES).items():
        p = Promise.parse(v)
        if p is not None:
            out[k.decode()] = p
    return out


def closing(pipe: Pipeline, model: str, version: str, ready_at: float) -> tuple[bool, Promise | None]:
    """In a transaction watching keys.ETA_PROMISES, before its MULTI: (is there a promise to close, the
    promise to count or None when it is dropped uncounted)."""
    raw = pipe.hget(keys.ETA_PROMISES, state.replica_field(model, version))
    if raw is None:
        return False, None
    p = Promise.parse(raw)
    if p is None or ready_at < p.at or ready_at - p.at > ABANDON_AFTER_S:
        return True, None  # unreadable, given after this replica was ready, or abandoned
    return True, p


def queue_close(pipe: Pipeline, model: str, version: str, ready_at: float, p: Promise | None) -> None:
    """Queue the close on `pipe` (after MULTI): the promise goes; a counted one's error, real − promised,
    is observed and kept."""
    pipe.hdel(keys.ETA_PROMISES, state.replica_field(model, version))
    if p is None:
        return
    real = ready_at - p.at
    histograms.observe(pipe, metrics_defs.ETA_ERROR, real - p.eta)
    pipe.lpush(keys.ETA_ERRORS, json.dumps({"model": model, "version": version, "at": p.at,
                                            "promised": p.eta, "real": round(real, 3)}))
    pipe.ltrim(keys.ETA_ERRORS, 0, KEPT - 1)


def report(r: redis.Redis, limit: int = 50) -> dict[str, Any]:
    """The kept closed promises: how many, real − promised median / p95 / mean |error| in seconds, and the
    `limit` newest (each with its error)."""
    recent = []
    for raw in r.lrange(keys.ETA_ERRORS, 0, KEPT - 1):
        try:
            rec = json.loads(raw)
            rec["error"] = round(float(rec["real"]) - float(rec["promised"]), 3)
        except (ValueError, KeyError, TypeError):
            continue  # a record this version cannot read is left out, not fatal
        recent.append(rec)
    errs = [x["error"] for x in recent]
    summary = None
    if errs:
        # "inclusive": linear interpolation between closest ranks (numpy's default); one error is its own p95
        p95 = statistics.quantiles(errs, n=20, method="inclusive")[18] if len(errs) > 1 else errs[0]
        summary = {"median": round(statistics.median(errs), 3), "p95": round(p95, 3),
                   "mean_abs": round(statistics.fmean(abs(x) for x in errs), 3)}
    return {"count": len(errs), "kept": KEPT, "error_seconds": summary, "recent": recent[:limit]}
