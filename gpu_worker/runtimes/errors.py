"""Why a runtime could not host a replica. Each is a WorkerError (LoadFailed or WarmupFailed), so the
worker turns it into `failed` with the message as the reason; importable without torch (Celery clients
rebuild them)."""

from __future__ import annotations

from gpu_worker.errors import BadRequest, LoadFailed, WarmupFailed


class CheckpointError(LoadFailed):
    """A Hugging Face checkpoint directory that cannot be used as it is."""


class MissingConfig(CheckpointError):
    """The checkpoint has no config.json (or one that is not a JSON object)."""


class UnknownArchitecture(CheckpointError):
    """transformers does not know the config's model_type / architecture (or it is not a causal LM)."""


class ShapeMismatch(CheckpointError):
    """The weights' names, dtypes or shapes disagree with the module the config describes."""


class EngineFailed(LoadFailed):
    """An engine process that did not start, did not become healthy, or died; `log_tail` holds the last
    lines of its log (also in the message: they are the engine's own reason)."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\n--- last lines of the engine's log ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


class EngineWarmupFailed(WarmupFailed):
    """The engine became healthy but failed a warmup request."""


class EngineNotInstalled(LoadFailed):
    """The engine's environment is missing: `prewarm engines install <name>` installs it."""


class BadServeRequest(BadRequest):
    """A request to a ready replica that the runtime cannot serve (says which field is wrong)."""


class ReleaseFailed(LoadFailed):
    """Something of a released replica is still there (a process, a port); the message says what."""


class AdapterRefused(LoadFailed):
    """A LoRA adapter that cannot be loaded on this GPU now: its base has no ready replica here, or the
    base replica's LoRA slots are all taken (the message names them and what to do)."""
