"""The Celery tasks a GPU worker runs, registered under the names in prewarm.celery_app.

Senders (scheduler, web, CLI) use `send_task(name, ...)` to the GPU's queue `gpu.<node>.<device>` and
never import this module. The GPU a task is for is its `gpu` kwarg when given, else the queue it came
from. Shapes:

- preload(model, version=None, *, reason="", kind="", gpu=None)
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

A preload that finds its GPU at `max_loads_per_gpu` loads (or its own model already loading) goes back to
the queue for RETRY_BUSY_SECONDS instead of holding a thread (the replica shows `pending` meanwhile); the
result is the same once it runs. An evict of the model cancels such waiting preloads.
Failures raise gpu_worker.errors.* (importable without torch) with a message naming what and where.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task

from gpu_worker.errors import Busy, WorkerError
from gpu_worker.residency import GpuSlot, NodeWorker
from prewarm.celery_app import EVICT, INFER, PRELOAD, STAGE, UNSTAGE

RETRY_BUSY_SECONDS = 0.5


def _gpu(worker: NodeWorker, task: Task, gpu: str | None) -> GpuSlot:
    info = task.request.delivery_info or {}
    return worker.gpu_for(gpu, info.get("routing_key"))


def register(app: Celery, worker: NodeWorker) -> None:
    # Retrying is the sender's call (it sees the reason); redelivery after a worker crash is acks_late's.
    # `throws`: a WorkerError is a reported outcome (logged in one line by us), not a crash with a traceback.
    @app.task(name=PRELOAD, bind=True, max_retries=None, throws=(WorkerError,))
    def preload(self: Task, model: str, version: str | None = None, *, reason: str = "", kind: str = "",
                gpu: str | None = None) -> dict[str, Any]:
        try:
            return worker.preload(_gpu(worker, self, gpu), model, version, reason=reason, kind=kind, defer=True,
                                  task_id=self.request.id)
        except Busy:
            # Back to the queue for a moment: a thread waiting on another load could be serving infer.
            raise self.retry(countdown=RETRY_BUSY_SECONDS) from None

    @app.task(name=EVICT, bind=True, throws=(WorkerError,))
    def evict(self: Task, model: str, *, version: str | None = None, reason: str = "",
              gpu: str | None = None) -> dict[str, Any]:
        return worker.evict(_gpu(worker, self, gpu), model, version, reason=reason)

    @app.task(name=INFER, bind=True, throws=(WorkerError,))
    def infer(self: Task, model: str, inputs: Any = None, *, version: str | None = None, gpu: str | None = None,
              seed: int = 0) -> dict[str, Any]:
        return worker.infer(_gpu(worker, self, gpu), model, inputs, version=version, seed=seed)

    # The host cache is the node's: `gpu` (or the queue) only has to be one of this worker's GPUs.
    @app.task(name=STAGE, bind=True, throws=(WorkerError,))
    def stage(self: Task, model: str, version: str | None = None, *, reason: str = "", kind: str = "",
              gpu: str | None = None, value: float = 0.0) -> dict[str, Any]:
        _gpu(worker, self, gpu)
        return worker.stage(model, version, reason=reason, kind=kind, value=value)

    @app.task(name=UNSTAGE, bind=True, throws=(WorkerError,))
    def unstage(self: Task, model: str, *, version: str | None = None, reason: str = "",
                gpu: str | None = None) -> dict[str, Any]:
        _gpu(worker, self, gpu)
        return worker.unstage(model, version, reason=reason)
