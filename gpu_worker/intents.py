"""Whether a delivered task still stands for an intent in flight, and dropping it when it does not.

The dispatcher claims an intent per (model, target) and sends its id and deadline with the task
(`state.Intent.task_kwargs`). With acks_late, a task whose worker died unacknowledged comes back when the
broker's visibility timeout lapses, up to an hour later, when nobody wants that action any more. The rule:

- A task carrying an intent id runs only while that very intent is held: not past its deadline, the intent
  still there, and no other id held for that (model, target) (an evict supersedes a preload, or a new
  dispatch after the old one expired). Otherwise it is dropped as stale: a `stale` event and a warning,
  nothing else (its intent, if any, belongs to someone else and is left alone).
- A task without an intent id (sent by hand with send_task, or queued by an older dispatcher) is never
  stale: it runs as it always did, and releases only an intent claimed without an id.
- When Redis cannot be read the task runs: a task is dropped only on evidence that it is stale.
- A Redis failover (prewarm.failover) can lose the intent and keep the task (replication is asynchronous):
  an intent missing, before the task's deadline, within one intent TTL of a failover, is re-claimed with
  the task's own id and the task runs (it is a preload or an evict the dispatcher did send). If something
  else holds the (model, target) by then, the task is superseded as usual.
"""

from __future__ import annotations

import logging
import time

import redis

from gpu_worker.errors import Stale
from prewarm import events, failover, state

log = logging.getLogger("prewarm.worker")


def stale_reason(r: redis.Redis, model: str, target: str, intent_id: str, deadline: float | None,
                 now: float | None = None, *, action: str = "", version: str | None = None,
                 intent_ttl: float = 0.0) -> str | None:
    """Why a task for (model, target) carrying `intent_id` is stale, or None when it should run.
    `intent_ttl`: how long after a failover a missing intent is taken for one the failover lost (0: never)."""
    if not intent_id:
        return None
    now = time.time() if now is None else now
    if deadline is not None and now > deadline:
        return f"its intent expired {now - deadline:.1f} s before it was delivered"
    try:
        held = state.held_intent(r, model, target)
    except redis.RedisError as exc:
        log.warning("could not read the intent of %s on %s (%s): running the task", model, target, exc)
        return None
    if held is None and intent_ttl > 0 and _lost_in_failover(r, action, model, version, target, intent_id,
                                                             deadline, intent_ttl, now):
        return None
    if held is None:
        return "its intent is no longer held (expired, or cleared by a worker restart)"
    if held.id != intent_id:
        return f"superseded by the {held.action} of {held.model}@{held.version} in flight ({held.actor}: {held.reason})"
    return None


def _lost_in_failover(r: redis.Redis, action: str, model: str, version: str | None, target: str, intent_id: str,
                      deadline: float | None, intent_ttl: float, now: float) -> bool:
    """The intent vanished with a failover: claim it again under the task's id (True), so the task runs and
    releases it as usual. False: no recent failover, or another intent took (model, target) meanwhile."""
    try:
        seen = failover.recent(r, intent_ttl, now)
        if seen is None:
            return False
        again = state.Intent(action=action or "preload", model=model, version=version or "", gpu=target,
                             actor="worker", reason="claimed again after a Redis failover lost it",
                             created_at=now, expires_at=deadline if deadline is not None else now + intent_ttl,
                             id=intent_id)
        if not state.claim_intent(r, again):
            return False
    except redis.RedisError as exc:
        log.warning("could not check the intent of %s on %s against a failover (%s)", model, target, exc)
        return False
    log.warning("%s of %s on %s: its intent was lost in the Redis failover at %.0f; claimed again, running it",
                action or "task", model, target, seen.failover_at or now)
    return True


def drop(r: redis.Redis, action: str, model: str, version: str | None, target: str, why: str, intent_id: str,
         *, maxlen: int) -> Stale:
    """Record a stale task (event kind `stale`, actor worker) and return the error the task fails with."""
    msg = f"{action} of {model}@{version or '?'} on {target} dropped as stale: {why}"
    log.warning("%s", msg)
    try:
        events.record(r, "stale", "worker", model=model, gpu=target, reason=msg,
                      numbers={"action": action, "version": version, "intent_id": intent_id}, maxlen=maxlen)
    except redis.RedisError as exc:
        log.warning("could not record the stale %s of %s: %s", action, model, exc)
    return Stale(msg)
