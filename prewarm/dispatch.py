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

Batches: `send_many(orders)` dispatches many actions (the scheduler's tick) in three steps whatever their
number: one pipelined round trip claims every intent, the claimed tasks are published over one broker
connection (one producer, its messages and "task-sent" events written in one pipeline by kombu's publish
batch), and one pipelined round trip writes the records of what was sent (dispatch counts, load kinds,
events) and releases the intent of any task whose publish failed. One failed publish is that order's answer
(the exception); the others are sent and recorded. If the broker write of the whole batch fails, every
task in it is answered with that error and its intent released (a task that did arrive is then dropped by
its worker as stale). preload/evict/stage/unstage are batches of one.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery

from prewarm import celery_app, events, state
from prewarm import priority as priorities
from prewarm.domain.action_kinds import DEMAND
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


# One order's outcome in a batch: what was dispatched (sent, or refused by the action in flight), or the
# exception its publish raised (nothing was sent for it and its intent was released).
Answer = Dispatched | Exception


def _describe(it: state.Intent) -> str:
    return f"{it.action} of {it.model}@{it.version} ({it.actor}: {it.reason})"


@dataclass(frozen=True)
class Order:
    """One action to dispatch: what `Dispatcher.preload/evict/stage/unstage` take, as a value, so that a
    tick's actions go out as one batch (`Dispatcher.send_many`). `gpu`: the GPU whose queue carries the task
    (for stage/unstage any live GPU of the node). `value`: a stage's keep-value (see `Dispatcher.stage`)."""

    action: str  # "preload" | "evict" | "stage" | "unstage"
    model: str
    version: str
    gpu: state.Gpu
    actor: str
    reason: str
    numbers: dict[str, Any] | None = None
    kind: str = ""
    value: float = 0.0
    # a preload's priority, only when not normal: a message without one is normal to every worker version
    priority: str | None = None
    # Whether the worker stores the task's result (`prewarm ops preload --wait` reads it). The scheduler's
    # tasks are read by nobody: without a result the sender does not subscribe to each task's result channel
    # (two more sends per task) and Redis keeps no result record per task for an hour.
    result: bool = True


@dataclass
class _Prepared:
    order: Order
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    target: str  # what the intent and event are about: the GPU, or host_id(node) for the host cache
    supersedes: tuple[str, ...]
    intent: state.Intent = field(init=False)


def order_preload(model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
                  numbers: dict[str, Any] | None = None, kind: str = DEMAND, priority: str | None = None,
                  result: bool = True) -> Order:
    """A preload Order; a priority other than normal is also in the event's numbers."""
    if priority in (None, priorities.DEFAULT):
        priority = None
    else:
        numbers = {**(numbers or {}), "priority": priority}
    return Order("preload", model, version, gpu, actor, reason, numbers, kind, priority=priority, result=result)


def _prepare(o: Order) -> _Prepared:
    if o.action == "preload":
        extra = {"priority": o.priority} if o.priority not in (None, priorities.DEFAULT) else {}
        return _Prepared(o, celery_app.PRELOAD, [o.model, o.version], {"reason": o.reason, "kind": o.kind, **extra},
                         o.gpu.id, ())
    if o.action == "evict":
        return _Prepared(o, celery_app.EVICT, [o.model], {"version": o.version, "reason": o.reason}, o.gpu.id,
                         ("preload",))
    if o.action == "stage":
        return _Prepared(o, celery_app.STAGE, [o.model, o.version],
                         {"reason": o.reason, "kind": o.kind, "value": o.value}, state.host_id(o.gpu.node), ())
    if o.action == "unstage":
        return _Prepared(o, celery_app.UNSTAGE, [o.model], {"version": o.version, "reason": o.reason},
                         state.host_id(o.gpu.node), ())
    raise ValueError(f"unknown action {o.action!r}: preload, evict, stage or unstage")


def _refused(p: _Prepared, held: state.Intent | None) -> Dispatched:
    o = p.order
    what = _describe(held) if held is not None else "another action on it"
    return Dispatched(False, "", p.target, f"{o.action} of {o.model}@{o.version} on {p.target} refused: {what} is "
                                           "in flight there; try again once it has ended", held=held)


def _publish_batch(producer: Any) -> contextlib.AbstractContextManager[Any]:
    """kombu's Producer.batch() (kombu 5.7+) where there is one; else publish each task as it comes."""
    batch = getattr(producer, "batch", None)
    return batch() if batch is not None else contextlib.nullcontext()


class Dispatcher:
    def __init__(self, r: redis.Redis, celery: Celery, *, intent_ttl: float = 120.0,
                 event_log_max: int = 5000) -> None:
        self.r = r
        self.celery = celery
        self.intent_ttl = intent_ttl
        self.event_log_max = event_log_max

    def send_many(self, orders: Sequence[Order]) -> list[Answer]:
        """Dispatch `orders` in order, as one batch (see the module docstring): one answer per order, a
        Dispatched (sent, or refused by the action in flight there) or the exception its publish raised
        (nothing was sent for it and its intent was released). An error of Redis itself raises."""
        prepared = [_prepare(o) for o in orders]  # an unknown action is refused before anything is claimed
        if not prepared:
            return []
        now = time.time()
        for p in prepared:
            o = p.order
            # The task id is chosen here, so the intent is complete when claimed (never rewritten after the
            # send, which could overwrite an intent that superseded it meanwhile).
            p.intent = state.Intent(action=o.action, model=o.model, version=o.version, gpu=p.target,
                                    actor=o.actor, reason=o.reason, created_at=now, expires_at=now + self.intent_ttl,
                                    kind=o.kind, id=uuid.uuid4().hex, task_id=str(uuid.uuid4()))
        claims = state.claim_intents(self.r, [(p.intent, p.supersedes) for p in prepared])
        answers: list[Answer | None] = [None] * len(prepared)  # None until its order is answered
        sent: list[tuple[int, state.Intent | None]] = []
        try:
            with self.celery.producer_or_acquire() as producer:  # one broker connection for the whole batch
                # kombu's publish batch (Redis transport): the tasks' LPUSHes and their "task-sent" events go
                # out in one pipeline when the block ends. Without it each task is two round trips.
                with _publish_batch(producer):
                    for i, (p, (claimed, held)) in enumerate(zip(prepared, claims, strict=True)):
                        if not claimed:
                            answers[i] = _refused(p, held)
                            continue
                        try:
                            self._publish(producer, p, held)
                        except Exception as exc:  # this task alone: it was never buffered
                            answers[i] = exc
                            continue
                        sent.append((i, held))
        except Exception as exc:
            # The batch's one write failed (or no producer could be had): whether any of its tasks arrived is
            # unknown. Every claimed order not answered yet gets the error and its intent is released below,
            # so a task that did arrive is dropped by its worker as stale.
            for i, (claimed, _held) in enumerate(claims):
                if claimed and not isinstance(answers[i], Exception):
                    answers[i] = exc
            sent = []
        failed = [prepared[i] for i, a in enumerate(answers) if isinstance(a, Exception)]
        pipe = self.r.pipeline(transaction=False)
        for p in failed:  # nothing was sent for it: leave no claim behind
            state.queue_release_intent(pipe, p.order.model, p.target, p.intent.id)
        for i, held in sent:
            answers[i] = self._record(pipe, prepared[i], held)
        if failed or sent:
            pipe.execute()
        return [a for a in answers if a is not None]

    def _publish(self, producer: Any, p: _Prepared, held: state.Intent | None) -> None:
        kwargs = {**p.kwargs, **p.intent.task_kwargs()}
        if held is not None:
            kwargs["supersedes"] = held.id  # the worker cancels that preload's load, or its waiting task
        self.celery.send_task(p.task, args=p.args, kwargs=kwargs, queue=p.order.gpu.queue, task_id=p.intent.task_id,
                              producer=producer, ignore_result=not p.order.result)

    def _record(self, pipe: redis.client.Pipeline, p: _Prepared, held: state.Intent | None) -> Dispatched:
        """Queue the records of one sent action on `pipe`; the answer to give for it."""
        o = p.order
        dispatch_counts.count(pipe, o.action, o.kind)  # prewarm_*_total
        if o.action == "preload":  # was the replica loaded ahead of demand? (the ROI's cold starts avoided)
            load_kinds.note(pipe, o.model, o.version, p.target, o.actor, o.kind)
        numbers = {**(o.numbers or {}), "kind": o.kind} if o.kind else o.numbers
        if held is not None:
            numbers = {**(numbers or {}), "supersedes": held.action, "supersedes_actor": held.actor}
        events.record(pipe, o.action, o.actor, model=o.model, gpu=p.target, reason=o.reason, numbers=numbers,
                      maxlen=self.event_log_max)
        via = f" (via {o.gpu.queue})" if p.target != o.gpu.id else ""
        cancels = f"; it cancels the {_describe(held)} in flight" if held is not None else ""
        return Dispatched(True, p.intent.task_id, p.target, f"{o.action} of {o.model} queued on {p.target}{via}{cancels}",
                          intent_id=p.intent.id, held=held)

    def _one(self, order: Order) -> Dispatched:
        [answer] = self.send_many([order])
        if isinstance(answer, Exception):
            raise answer
        return answer

    def preload(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
                numbers: dict[str, Any] | None = None, kind: str = DEMAND, priority: str | None = None) -> Dispatched:
        return self._one(order_preload(model, version, gpu, actor=actor, reason=reason, numbers=numbers, kind=kind,
                                       priority=priority))

    def evict(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
              numbers: dict[str, Any] | None = None, kind: str = "") -> Dispatched:
        """Evict `model@version` from `gpu`; a preload of that version in flight there is cancelled."""
        return self._one(Order("evict", model, version, gpu, actor, reason, numbers, kind))

    def stage(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
              numbers: dict[str, Any] | None = None, kind: str = "", value: float = 0.0) -> Dispatched:
        """Stage into the host cache of `gpu.node` (`gpu`: any live GPU of that node, whose queue carries it).
        `value`: the keep-value the node's value-per-byte eviction compares."""
        return self._one(Order("stage", model, version, gpu, actor, reason, numbers, kind, value))

    def unstage(self, model: str, version: str, gpu: state.Gpu, *, actor: str, reason: str,
                numbers: dict[str, Any] | None = None, kind: str = "") -> Dispatched:
        """Drop the model's staged bytes from the host cache of `gpu.node`."""
        return self._one(Order("unstage", model, version, gpu, actor, reason, numbers, kind))
