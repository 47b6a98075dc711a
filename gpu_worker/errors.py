"""Errors a worker task fails with. Importable without torch: Celery rebuilds them on the client side
(web, scheduler, CLI), which must never need torch.

Every message says what failed and where (model, GPU, file, tensor) in words an operator can act on.
"""

from __future__ import annotations


class WorkerError(Exception):
    """A task that could not do what it was asked; the message is shown to operators as is."""


class UnknownModel(WorkerError):
    """The model (or version) is not in this worker's catalog."""


class DoesNotFit(WorkerError):
    """The model needs more device memory than the GPU has free (or holds at all)."""


class LoadFailed(WorkerError):
    """Reading, checking or building the weights failed (corrupt file, missing shard, mismatch...)."""


class CatalogRefused(UnknownModel, LoadFailed):
    """The catalog lists the model but this worker refused its entry (weights outside the model roots, a
    builder that cannot be imported, a broken file...); the message is that entry's problem. Both an
    unknown model (nothing of it is usable here) and a load failure (its files or builder are at fault)."""


class WarmupFailed(WorkerError):
    """The loaded module failed on a declared warmup input."""


class WarmupDoesNotFit(DoesNotFit, WarmupFailed):
    """A warmup input's passes (the input and its activations) need more device memory than is free: the
    load is refused and the replica released (gpu_worker/runtimes/warmup_memory.py)."""


class NotResident(WorkerError):
    """The model is not ready on this GPU."""


class Cancelled(WorkerError):
    """A preload was cancelled (the model was evicted, or the worker is shutting down)."""


class BadRequest(WorkerError):
    """The task's arguments cannot be used (unknown GPU, malformed inputs)."""


class Busy(WorkerError):
    """The GPU already runs as many loads as it may (or this very load): the task is retried shortly,
    so a queue of preloads never ties up the threads that inference needs."""


class Stale(WorkerError):
    """The task was delivered after its intent expired or was superseded (e.g. redelivered by the broker an
    hour after a worker died): dropped without acting, recorded as a `stale` event."""
