"""The one dispatch path for actions on the fleet, used by the scheduler, the console/API, the route hook
and the CLI alike.

Dispatching claims an intent for (model, gpu) atomically (SET NX with a TTL), so two schedulers, a
double-clicked button or a burst of route calls send one task, not several; then it sends the task by
name to the GPU's queue and records the decision in the event log with who and why. An intent the worker
never confirms expires by itself and the model can be planned again.

Stage/unstage act on a node's host cache, not a GPU: their intent is claimed per (model, host_id(node))
(`node-a/host`), and the task goes to the queue of any live GPU of that node (the `gpu` given).

Every task carries its intent's id and deadline (`Intent.task_kwargs`): a task the broker redelivers after
its intent expired or was superseded (a worker killed mid-task, an hour later) is dropped by the worker as
stale. An evict supersedes a preload of the same model version in flight on that GPU (its intent is taken
over, and the evict task names it in `supersedes`): the worker cancels that load, or drops the preload's
task when it arrives. Any other action already in flight refuses the new one, and the answer says which.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from prewarm import celery_app, events, state
from prewarm import priority as priorities
from prewarm.store import dispatch_counts, load_kinds


@dataclass
class Dispatched:
    sent: bool
    task_id: str
    gpu: str
    message: str
    intent_id: str = ""  # the intent this dispatch claimed ("" when refused)
    # Refused: the intent in flight that refused it. Sent: the intent it superseded (an evict taking over a
    # preload), else None.
    held: state.Intent | None = None

    @property
    def superseded(self) -> bool:
        return self.sent and self.held is not None


def _describe(it: state.Intent) -> str:
    return f"{it.action} of {it.model}@{it.version} ({it.actor}: {it.reason})"


class Dispatcher:
    def __init__(self, r: redis.Redis, celery: Celery, *, intent_ttl: float = 120.0,
                 event_log_max: int = 5000) -> None:
        self.r = r
        self.celery = celery
        self.intent_ttl = intent_ttl
        self.event_log_max = event_log_max

    def _send(self, action: str, task: str, model: str, version: str, gpu: state.Gpu, actor: str,
              reason: str, numbers: dict[str, Any] | None, kind: str, args: list[Any],
              kwargs: dict[str, Any], *, target: str | None = None, supersedes: Collection[str] = ()) -> Dispatched:
        # target: what the intent and event are about (the GPU, or host_id(node) for the host cache).
        target = target or gpu.id
        now = time.time()
        # The task id is chosen here, so the intent is complete when claimed (never rewritten after the send,
        # which could overwrite an intent that superseded it meanwhile).
        intent = state.Intent(action=action, model=model, version=version, gpu=target, actor=actor,
                              reason=reason, created_at=now, expires_at=now + self.intent_ttl, kind=kind,
                              id=uuid.uuid4().hex, task_id=str(uuid.uuid4()))
        if supersedes:
            claimed, held = state.claim_intent_over(self.r, intent, supersedes)
        else:
            claimed, held = state.claim_intent(self.r, intent), None
            if not claimed:
                held = state.held_intent(self.r, model, target)
        if not claimed:
            what = _describe(held) if held is not None else "another action on it"
            return Dispatched(False, "", target, f"{action} of {model}@{version} on {target} refused: {what} is "
                                                 "in flight there; try again once it has ended", held=held)
        kwargs = {**kwargs, **intent.task_kwargs()}
        if held is not None:
            kwargs["supersedes"] = held.id  # the worker cancels that preload's load, or its waiting task
        try:
            result = self.celery.send_task(task, args=args, kwargs=kwargs, queue=gpu.queue, task_id=intent.task_id)
        except Exception:
            state.release_intent(self.r, model, target, intent.id)  # nothing was sent: leave no claim behind
            raise
        dispatch_counts.count(self.r, action, kind)  # prewarm_*_total
        if action == "preload":  # was the replica loaded ahead of demand? (the ROI's cold starts avoided)
            load_kinds.note(self.r, model, version, target, actor, kind)
        numbers = {**(numbers or {}), "kind": kind} if kind else numbers
        if held is not None:
            numbers = {**(numbers or {}), "supersedes": held.action, "supersedes_actor": held.actor}
        events.record(self.r, action, actor, model=model, gpu=target, reason=reason, numbers=numbers,
                      maxlen=self.event_log_max)
        via = f" (via {gpu.queue})" if target != gpu.id else ""
        cancels = f"; it cancels the {_describe(held)} in flight" if held is not None else ""
        return Dispatched(True, result.id, target, f"{action} of {model} queued on {target}{via}{cancels}",
                          intent_id=intent.id, held=held)

    def preload(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
                numbers: dict[str, Any] | None = None, kind: str = "demand", priority: str | None = None) -> Dispatched:
        # priority only when not normal: a message without one is normal, to every worker version
        extra = {"priority": priority} if priority not in (None, priorities.DEFAULT) else {}
        if extra:
            numbers = {**(numbers or {}), **extra}
        return self._send("preload", celery_app.PRELOAD, model, version, gpu, actor, reason, numbers, kind,
                          [model, version], {"reason": reason, "kind": kind, **extra})

    def evict(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
              numbers: dict[str, Any] | None = None, kind: str = "") -> Dispatched:
        """Evict `model@version` from `gpu`; a preload of that version in flight there is cancelled."""
        return self._send("evict", celery_app.EVICT, model, version, gpu, actor, reason, numbers, kind,
                          [model], {"version": version, "reason": reason}, supersedes=("preload",))

    def stage(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
              numbers: dict[str, Any] | None = None, kind: str = "", value: float = 0.0) -> Dispatched:
        """Stage into the host cache of `gpu.node` (`gpu`: any live GPU of that node, whose queue carries it).
        `value`: the keep-value the node's value-per-byte eviction compares."""
        return self._send("stage", celery_app.STAGE, model, version, gpu, actor, reason, numbers, kind,
                          [model, version], {"reason": reason, "kind": kind, "value": value},
                          target=state.host_id(gpu.node))

    def unstage(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
                numbers: dict[str, Any] | None = None, kind: str = "") -> Dispatched:
        """Drop the model's staged bytes from the host cache of `gpu.node`."""
        return self._send("unstage", celery_app.UNSTAGE, model, version, gpu, actor, reason, numbers, kind,
                          [model], {"version": version, "reason": reason}, target=state.host_id(gpu.node))
