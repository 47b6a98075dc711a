"""Drain records: which nodes take no new preloads because they are being emptied (keys.DRAINING).

One JSON record per node in one hash. State "draining": the node's replicas that still have demand are
being loaded elsewhere (prewarm.services.drain), then its worker evicts its own replicas and exits;
"drained": that is done. `worker` is the worker id that served the node when the drain began: a new
worker on that node (a restarted pod) is a fresh start and clears the record (`clear_for_new_worker`).

Every change writes its event (`drain`, `drained`, `undrain`) in the same transaction, once: a second drain
of a draining node changes nothing and records nothing (idempotent).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import redis

from prewarm import events, keys

DRAINING = "draining"
DRAINED = "drained"


@dataclass(frozen=True)
class Drain:
    node: str
    state: str  # DRAINING | DRAINED
    since: float  # when the drain began
    actor: str  # who began it: "operator" (CLI, API, console) or "worker" (SIGTERM)
    reason: str
    grace_s: float  # the time the worker gives the replacements (PREWARM_DRAIN_GRACE of the one that began it)
    worker: str = ""  # the worker id serving the node when the drain began
    drained_at: float | None = None

    @property
    def draining(self) -> bool:
        return self.state == DRAINING

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    def public(self) -> dict[str, Any]:
        return asdict(self)


def parse(node: str, raw: bytes | str) -> Drain | None:
    """The record of `node` as stored; None when it cannot be read (written by hand?): not draining."""
    try:
        d = json.loads(raw)
        return Drain(node=node, state=str(d["state"]), since=float(d["since"]), actor=str(d.get("actor", "")),
                     reason=str(d.get("reason", "")), grace_s=float(d.get("grace_s", 0)),
                     worker=str(d.get("worker", "")),
                     drained_at=None if d.get("drained_at") is None else float(d["drained_at"]))
    except (ValueError, TypeError, KeyError):
        return None


def parse_all(raw: dict[bytes, bytes]) -> dict[str, Drain]:
    """The hash as read (HGETALL keys.DRAINING) -> node -> Drain; unreadable entries left out."""
    out = {}
    for k, v in raw.items():
        node = k.decode()
        if (d := parse(node, v)) is not None:
            out[node] = d
    return out


def read_all(r: redis.Redis) -> dict[str, Drain]:
    return parse_all(r.hgetall(keys.DRAINING))


def get(r: redis.Redis, node: str) -> Drain | None:
    raw = r.hget(keys.DRAINING, node)
    return parse(node, raw) if raw is not None else None


def begin(r: redis.Redis, node: str, *, actor: str, reason: str, grace_s: float, worker: str, now: float,
          maxlen: int = 5000) -> tuple[Drain, bool]:
    """Mark `node` draining, with a `drain` event; (the record, True) when this call began it, (the record
    held, False) when it was draining already, or drained by this same `worker` (it is on its way out):
    nothing written. A node drained under an earlier worker is drained again."""
    new = Drain(node, DRAINING, now, actor, reason, grace_s, worker)
    for _ in range(20):  # retried only while another writer changes the record between WATCH and EXEC
        with r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(keys.DRAINING)
                raw = pipe.hget(keys.DRAINING, node)
                held = parse(node, raw) if raw is not None else None
                if held is not None and (held.draining or (worker and held.worker == worker)):
                    return held, False
                pipe.multi()
                pipe.hset(keys.DRAINING, node, new.to_json())
                events.record(pipe, "drain", actor, gpu=node, reason=reason,
                              numbers={"node": node, "grace_s": grace_s}, maxlen=maxlen, ts=now)
                pipe.execute()
                return new, True
            except redis.WatchError:
                continue
    raise RuntimeError(f"the drain record of {node} kept changing while it was written")


def finish(r: redis.Redis, node: str, *, worker: str, evicted: int, now: float, maxlen: int = 5000) -> bool:
    """The node's worker evicted its replicas: the record turns "drained", with a `drained` event. False
    (nothing written) when the node is no longer draining (undrained meanwhile)."""
    with r.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(keys.DRAINING)
            raw = pipe.hget(keys.DRAINING, node)
            held = parse(node, raw) if raw is not None else None
            if held is None or not held.draining:
                return False
            done = Drain(node, DRAINED, held.since, held.actor, held.reason, held.grace_s, held.worker or worker,
                         drained_at=now)
            pipe.multi()
            pipe.hset(keys.DRAINING, node, done.to_json())
            events.record(pipe, "drained", "worker", gpu=node,
                          reason=f"{node} drained: {evicted} replica(s) evicted after {now - held.since:.1f} s; "
                                 "its worker exits",
                          numbers={"node": node, "evicted": evicted, "seconds": round(now - held.since, 3)},
                          maxlen=maxlen, ts=now)
            pipe.execute()
            return True
        except redis.WatchError:
            return False


def end(r: redis.Redis, node: str, *, actor: str, reason: str, now: float, maxlen: int = 5000) -> Drain | None:
    """Remove the node's record (it takes loads again), with an `undrain` event; the record removed, or None
    when there was none (nothing written)."""
    with r.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(keys.DRAINING)
            raw = pipe.hget(keys.DRAINING, node)
            if raw is None:
                return None
            pipe.multi()
            pipe.hdel(keys.DRAINING, node)
            events.record(pipe, "undrain", actor, gpu=node, reason=reason, numbers={"node": node}, maxlen=maxlen,
                          ts=now)
            pipe.execute()
        except redis.WatchError:
            return None
    return parse(node, raw)


def clear_for_new_worker(r: redis.Redis, node: str, worker: str, now: float, maxlen: int = 5000) -> Drain | None:
    """A worker starting on `node` takes it back into service: a record left by an earlier worker (a drain
    that ended with that worker's exit, or one cut short by a kill) is removed. The record removed, or None."""
    held = get(r, node)
    if held is None or held.worker == worker:
        return None
    return end(r, node, actor="worker", now=now, maxlen=maxlen,
               reason=f"worker {worker} started on {node}: the node takes loads again (its last drain, "
                      f"{held.state}, was for worker {held.worker or '?'})")
