"""How a replica is hosted: the `Runtime` protocol, and the spec a worker hands a runtime.

A runtime owns one replica of one model on one device: how its bytes get there, how it is warmed, how a
request is served, what it really holds, and how it is let go. The worker keeps everything else (the
replica record and its publication, the device's byte accounting, locks, intents, events), so the
lifecycle a router sees is the same for every runtime.

Lifecycle (prewarm/state.py's replica states) and the calls behind each step::

    pending   runtime = make(spec); need = runtime.required_bytes()
              -> cheap checks only (headers, config): bad input fails here, before any byte is
                 reserved; the worker then reserves `need` on the device (DoesNotFit if it cannot)
    loading   runtime.load(progress, check_cancel) -> bytes the replica holds, measured
              -> the worker commits those bytes; `progress(done, total)` drives the published
                 progress; `check_cancel()` raises Cancelled when an evict arrives meanwhile
    warming   runtime.warm(check_cancel) -> per-entry figures (passes, stable, cut_short, latency_ms, first_ms)
              -> every declared warmup entry runs until its latency is stable (warmup.run_until_stable,
                 the same rule as the torch path: two passes within tolerance, bounded by passes, and by
                 time as a hard ceiling); in-process runtimes count each entry's memory against the
                 device while it warms (warmup_memory.WarmupMemory; WarmupDoesNotFit when it cannot)
    ready     runtime.serve(request) -> JSON-able answer (the `infer` task), concurrently with others;
              runtime.endpoint -> where a router sends requests itself (None: only through `infer`)
              runtime.measure() -> bytes held now (an engine's own process tree); the heartbeat asks
                 again every `remeasure_seconds` (engines) and the record and device accounting follow
              runtime.died() -> None while it can serve, else why not (an engine that exited: its
                 status and last log lines); the heartbeat asks, and fails the replica with that reason
    evicting  runtime.release() -> bytes freed; afterwards nothing of the replica is left (no tensor
              referenced, no process, no port), or it raises ReleaseFailed saying what is left
    failed    any step raises a gpu_worker.errors.WorkerError (LoadFailed / WarmupFailed subclasses
              from runtimes.errors) whose message is the reason; the worker then calls release()
              (always safe, idempotent) and publishes `failed` with that reason

The worker drives every runtime through this protocol (gpu_worker/lifecycle.py, Lifecycle._load): after
load it commits the measured bytes with Device.commit_measured (a footprint past the GPU's free budget
fails the replica, which is then released), and again after warm when the footprint grew.

Runtimes: `torch` (runtimes.torch_module.TorchRuntime: today's path, a module built by the catalog's
builder and filled by the streaming loader, promoted from the host cache where staged), `transformers`
(runtimes.hf.HFRuntime) and `vllm` (runtimes.vllm_engine.VllmRuntime), chosen by the catalog's `runtime`. This
module imports neither torch nor transformers: Celery clients and `prewarm engines` import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpu_worker.runtimes.warmup import WarmupPolicy
from prewarm.engines import DEFAULT_KV_CACHE_BYTES

if TYPE_CHECKING:
    from gpu_worker.device import Device

Progress = Callable[[int, int], None]
CheckCancel = Callable[[], None]


@dataclass(frozen=True)
class TokenWarmup:
    """One declared warmup entry of a token model: a batch of `batch` prompts of `prompt_tokens` tokens."""

    prompt_tokens: int
    batch: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.prompt_tokens, int) and self.prompt_tokens > 0):
            raise ValueError(f"warmup prompt_tokens must be a positive integer, not {self.prompt_tokens!r}")
        if not (isinstance(self.batch, int) and self.batch > 0):
            raise ValueError(f"warmup batch must be a positive integer, not {self.batch!r}")

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> TokenWarmup:
        unknown = set(raw) - {"prompt_tokens", "batch"}
        if unknown:
            raise ValueError(f"warmup entry {raw!r}: unknown field(s) {', '.join(sorted(unknown))}; "
                             "use prompt_tokens and batch")
        if "prompt_tokens" not in raw:
            raise ValueError(f"warmup entry {raw!r} needs prompt_tokens")
        return cls(raw["prompt_tokens"], raw.get("batch", 1))


@dataclass(frozen=True)
class ReplicaSpec:
    """What a runtime needs to host one replica; built by the worker from a catalog entry and its GPU."""

    model: str  # catalog id: also the name an engine serves the model under
    version: str
    path: Path  # the checkpoint directory (or weights) on this node
    device: str = "cpu"  # torch device string of the GPU: "cpu", "cuda:0"
    gpu: str = ""  # the GPU's id (`node/device`), for messages
    warmup: tuple[TokenWarmup, ...] = (TokenWarmup(16, 1),)
    policy: WarmupPolicy = field(default_factory=WarmupPolicy)
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES  # engines only: KV cache on top of the weights
    device_total_bytes: int | None = None  # CUDA engines: the device's memory, for the budget's share
    # The catalog's model roots: every file of the checkpoint is checked against them at load time (each
    # one prewarm reads at its open, the directory before a reader that opens by name is handed it).
    # None: no boundary (tools and tests that name their own checkpoint).
    roots: tuple[Path, ...] | None = None
    # In-process runtimes (transformers): the GPU's accounting, which each warmup entry's memory is counted
    # against while it warms (runtimes/warmup_memory.py); None: measured only (a bench).
    budget: Device | None = None

    @property
    def key(self) -> str:
        return f"{self.model}@{self.version}"

    @property
    def where(self) -> str:
        return f"{self.key} on {self.gpu or self.device}"


@runtime_checkable
class Runtime(Protocol):
    """One replica's host; see the module docstring for when the worker calls each method."""

    name: str
    # How often the heartbeat measures a ready replica again (None: never; bytes fixed once loaded).
    remeasure_seconds: float | None

    def required_bytes(self) -> int: ...

    def load(self, progress: Progress | None = None, check_cancel: CheckCancel | None = None) -> int: ...

    def warm(self, check_cancel: CheckCancel | None = None) -> list[dict[str, Any]]: ...

    def serve(self, request: dict[str, Any]) -> dict[str, Any]: ...

    def measure(self) -> int: ...

    def died(self) -> str | None: ...

    def release(self) -> int: ...

    @property
    def endpoint(self) -> str | None: ...
