"""The Celery tasks a GPU worker runs, registered under the names in prewarm.celery_app.

Senders (scheduler, web, CLI) use `send_task(name, ...)` to the GPU's queue `gpu.<node>.<device>` and
never import this module. The GPU a task is for is its `gpu` kwarg when given, else the queue it came
from. Shapes:

- preload(model, version=None, *, reason="", kind="", gpu=None, priority=None)
    -> {"model", "version", "gpu", "state": "ready", "bytes", "load_seconds", "warmup_seconds",
        "warmup": [{"shape", "dtype", "passes", "stable", "latency_ms", "first_ms"}], "noop"}
- evict(model, *, version=None, reason="", gpu=None)
    -> {"model", "gpu", "versions": [...], "bytes_freed", "noop", "free_bytes", "used_bytes"}
- infer(model, inputs=None, *, version=None, gpu=None, seed=0)
    -> {"model", "version", "gpu", "latency_ms", "latency_seconds", "input": {"shape", "dtype"},
        "output": {"shape", "dtype", "mean", "std", "min", "max", "finite", "top"?}}
- stage(model, version=None, *, reason="", kind="", gpu=None, value=0.0)   (node-level: any GPU queue of the node)
    -> {"model", "version", "node", "state": "staged", "bytes", "stage_seconds", "value", "pinned", "noop",
        "evicted": ["model@version", ...], "host_cache": {"budget_bytes", "used_bytes", "free_bytes"}}
- unstage(model, *, version=None, reason="", gpu=None)
    -> {"model", "node", "versions": [...], "bytes_freed", "noop", "host_cache": {...}}

A preload's result also carries "source": "host" (promoted from the node's host cache) or "storage".

Every task also takes `intent_id=""` and `deadline=None`: its intent's id and deadline, sent by the
dispatcher (`state.Intent.task_kwargs`); evict also `supersedes=""`, the id of the preload intent it took
over. A task delivered after its intent expired or was superseded is dropped as stale (gpu_worker.intents:
a `stale` event, errors.Stale, nothing else); one without an intent id always runs.

A preload that finds its GPU at `max_loads_per_gpu` loads (or its own model already loading) goes back to
the queue for RETRY_BUSY_SECONDS instead of holding a thread (the replica shows `pending` meanwhile); the
result is the same once it runs. An evict of the model cancels such waiting preloads. When a slot frees, the
waiting preload with the highest `priority` (high | normal | low; absent, as from older senders: normal) takes
it, the earliest queued within a priority.
Failures raise gpu_worker.errors.* (importable without torch) with a message naming what and where.
"""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery, Task

from gpu_worker import intents
from gpu_worker.errors import Busy, WorkerError
from gpu_worker.residency import LocalGpu, NodeWorker
from prewarm import priority as priorities
from prewarm import state
from prewarm.celery_app import EVICT, INFER, PRELOAD, STAGE, UNSTAGE

RETRY_BUSY_SECONDS = 0.5


def _gpu(worker: NodeWorker, task: Task, gpu: str | None) -> LocalGpu:
    info = task.request.delivery_info or {}
    return worker.gpu_for(gpu, info.get("routing_key"))


def _check(worker: NodeWorker, action: str, model: str, version: str | None, target: str, intent_id: str,
           deadline: float | None, g: LocalGpu | None = None) -> None:
    """Raise errors.Stale (after recording it) when the task's intent expired or was superseded."""
    why = intents.stale_reason(worker.r, model, target, intent_id, deadline)
    # Read after Redis: an evict that took this preload over marks it cancelled before it releases its own
    # intent, so an evict finishing on another thread between the two reads is still named as such.
    if g is not None and intent_id and intent_id in g.cancelled_tasks:
        why = "superseded by an evict of it, which ran first and cancelled it"
    if why:
        raise intents.drop(worker.r, action, model, version, target, why, intent_id,
                           maxlen=worker.options.event_log_max)


def _keep_alive(worker: NodeWorker, model: str, target: str, intent_id: str, deadline: float | None) -> float | None:
    """A preload this worker holds queued keeps its intent alive (so it is not stale when its turn comes);
    the deadline its retry carries."""
    if not intent_id:
        return deadline
    try:
        return state.extend_intent(worker.r, model, target, intent_id) or deadline
    except redis.RedisError:
        return deadline


def register(app: Celery, worker: NodeWorker) -> None:
    # Retrying is the sender's call (it sees the reason); redelivery after a worker crash is acks_late's.
    # `throws`: a WorkerError is a reported outcome (logged in one line by us), not a crash with a traceback.
    @app.task(name=PRELOAD, bind=True, max_retries=None, throws=(WorkerError,))
    def preload(self: Task, model: str, version: str | None = None, *, reason: str = "", kind: str = "",
                gpu: str | None = None, intent_id: str = "", deadline: float | None = None,
                priority: str | None = None) -> dict[str, Any]:
        g = _gpu(worker, self, gpu)
        try:
            _check(worker, "preload", model, version, g.id, intent_id, deadline, g)
        except WorkerError:
            worker.forget_queued(g, self.request.id)  # its `pending` placeholder, if it queued one
            raise
        try:
            return worker.preload(g, model, version, reason=reason, kind=kind, defer=True,
                                  task_id=self.request.id, intent_id=intent_id,
                                  priority=priority if priority in priorities.LEVELS else None)
        except Busy:
            # Back to the queue for a moment: a thread waiting on another load could be serving infer.
            deadline = _keep_alive(worker, model, g.id, intent_id, deadline)
            raise self.retry(countdown=RETRY_BUSY_SECONDS,
                             kwargs={**(self.request.kwargs or {}), "deadline": deadline}) from None

    @app.task(name=EVICT, bind=True, throws=(WorkerError,))
    def evict(self: Task, model: str, *, version: str | None = None, reason: str = "",
              gpu: str | None = None, intent_id: str = "", deadline: float | None = None,
              supersedes: str = "") -> dict[str, Any]:
        g = _gpu(worker, self, gpu)
        _check(worker, "evict", model, version, g.id, intent_id, deadline)
        return worker.evict(g, model, version, reason=reason, intent_id=intent_id, supersedes=supersedes)

    @app.task(name=INFER, bind=True, throws=(WorkerError,))
    def infer(self: Task, model: str, inputs: Any = None, *, version: str | None = None, gpu: str | None = None,
              seed: int = 0) -> dict[str, Any]:
        return worker.infer(_gpu(worker, self, gpu), model, inputs, version=version, seed=seed)

    # The host cache is the node's: `gpu` (or the queue) only has to be one of this worker's GPUs.
    @app.task(name=STAGE, bind=True, throws=(WorkerError,))
    def stage(self: Task, model: str, version: str | None = None, *, reason: str = "", kind: str = "",
              gpu: str | None = None, value: float = 0.0, intent_id: str = "",
              deadline: float | None = None) -> dict[str, Any]:
        _gpu(worker, self, gpu)
        _check(worker, "stage", model, version, state.host_id(worker.node), intent_id, deadline)
        return worker.stage(model, version, reason=reason, kind=kind, value=value, intent_id=intent_id)

    @app.task(name=UNSTAGE, bind=True, throws=(WorkerError,))
    def unstage(self: Task, model: str, *, version: str | None = None, reason: str = "",
                gpu: str | None = None, intent_id: str = "", deadline: float | None = None) -> dict[str, Any]:
        _gpu(worker, self, gpu)
        _check(worker, "unstage", model, version, state.host_id(worker.node), intent_id, deadline)
        return worker.unstage(model, version, reason=reason, intent_id=intent_id)
