"""The decision log: every action (by the scheduler, an operator or the router) with who and why.

A Redis stream trimmed to a bounded length. Reasons are words plus the numbers behind them; nothing
secret is ever written here (callers pass reasons, never request headers or tokens).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from prewarm import keys

ACTORS = ("scheduler", "operator", "router", "worker")


@dataclass
class Event:
    ts: float
    kind: str  # preload | evict | stage | promote | pin | unpin | keep | failed | ready | rollout | ...
    actor: str
    model: str = ""
    gpu: str = ""
    reason: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def public(self) -> dict[str, Any]:
        return asdict(self)


def record(r: redis.Redis | redis.client.Pipeline, kind: str, actor: str, *, model: str = "", gpu: str = "",
           reason: str = "", numbers: dict[str, Any] | None = None, maxlen: int = 5000,
           ts: float | None = None) -> None:
    fields = {"ts": f"{ts if ts is not None else time.time():.3f}", "kind": kind, "actor": actor,
              "model": model, "gpu": gpu, "reason": reason,
              "numbers": json.dumps(numbers or {}, separators=(",", ":"), default=str)}
    r.xadd(keys.EVENTS, fields, maxlen=maxlen, approximate=True)


def read(r: redis.Redis, *, limit: int = 200, model: str | None = None, gpu: str | None = None,
         actor: str | None = None, kind: str | None = None) -> list[Event]:
    """Newest first, filtered. Scans at most a few pages of the stream so a filter stays cheap."""
    out: list[Event] = []
    last = "+"
    for _ in range(20):
        batch = r.xrevrange(keys.EVENTS, max=last, count=500)
        if not batch:
            break
        for eid, f in batch:
            d = {k.decode(): v.decode() for k, v in f.items()}
            ev = Event(ts=float(d.get("ts", 0)), kind=d.get("kind", ""), actor=d.get("actor", ""),
                       model=d.get("model", ""), gpu=d.get("gpu", ""), reason=d.get("reason", ""),
                       numbers=json.loads(d.get("numbers") or "{}"), id=eid.decode())
            if (model and ev.model != model) or (gpu and ev.gpu != gpu) or (actor and ev.actor != actor) \
                    or (kind and ev.kind != kind):
                continue
            out.append(ev)
            if len(out) >= limit:
                return out
        last = "(" + batch[-1][0].decode()
    return out
