"""The one dispatch path for actions on the fleet, used by the scheduler, the console/API, the route hook
and the CLI alike.

Dispatching claims an intent for (model, gpu) atomically (SET NX with a TTL), so two schedulers, a
double-clicked button or a burst of route calls send one task, not several; then it sends the task by
name to the GPU's queue and records the decision in the event log with who and why. An intent the worker
never confirms expires by itself and the model can be planned again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from prewarm import celery_app, events, keys, state


@dataclass
class Dispatched:
    sent: bool
    task_id: str
    gpu: str
    message: str


class Dispatcher:
    def __init__(self, r: redis.Redis, celery: Celery, *, intent_ttl: float = 120.0,
                 event_log_max: int = 5000) -> None:
        self.r = r
        self.celery = celery
        self.intent_ttl = intent_ttl
        self.event_log_max = event_log_max

    def _send(self, action: str, task: str, model: str, version: str, gpu: state.Gpu, actor: str,
              reason: str, numbers: dict[str, Any] | None, kind: str, args: list[Any],
              kwargs: dict[str, Any]) -> Dispatched:
        now = time.time()
        intent = state.Intent(action=action, model=model, version=version, gpu=gpu.id, actor=actor,
                              reason=reason, created_at=now, expires_at=now + self.intent_ttl, kind=kind)
        if not state.claim_intent(self.r, intent):
            return Dispatched(False, "", gpu.id, f"{action} of {model} on {gpu.id} is already in flight")
        try:
            result = self.celery.send_task(task, args=args, kwargs=kwargs, queue=gpu.queue)
        except Exception:
            state.release_intent(self.r, model, gpu.id)  # nothing was sent: leave no claim behind
            raise
        intent.task_id = result.id
        state.update_intent(self.r, intent)
        self.r.hincrby(keys.DISPATCH_COUNTS, f"{action}:{kind or 'unspecified'}", 1)  # prewarm_*_total
        events.record(self.r, action, actor, model=model, gpu=gpu.id, reason=reason,
                      numbers={**(numbers or {}), "kind": kind} if kind else numbers,
                      maxlen=self.event_log_max)
        return Dispatched(True, result.id, gpu.id, f"{action} of {model} queued on {gpu.id}")

    def preload(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
                numbers: dict[str, Any] | None = None, kind: str = "demand") -> Dispatched:
        return self._send("preload", celery_app.PRELOAD, model, version, gpu, actor, reason, numbers, kind,
                          [model, version], {"reason": reason, "kind": kind})

    def evict(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
              numbers: dict[str, Any] | None = None, kind: str = "") -> Dispatched:
        return self._send("evict", celery_app.EVICT, model, version, gpu, actor, reason, numbers, kind,
                          [model], {"version": version, "reason": reason})
