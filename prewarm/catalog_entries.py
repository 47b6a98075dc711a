"""The catalog's records: a Catalog of ModelEntry (with their warmup inputs, WarmupInput or
TokenWarmupInput), and CatalogError, what a catalog that cannot be used raises. prewarm.catalog reads the
TOML file into them (its docstring documents every field).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prewarm import priority as priorities

ADAPTER_RUNTIME = "vllm-adapter"  # a LoRA adapter served inside a ready replica of its vllm base


class CatalogError(ValueError):
    """A catalog that cannot be used; the message names the entry and field at fault."""


def entry_error(where: str, msg: str) -> CatalogError:
    """The CatalogError of `where` (an entry, or a warmup table of one): "where: msg"."""
    return CatalogError(f"{where}: {msg}")


@dataclass(frozen=True)
class WarmupInput:
    shape: tuple[int, ...]
    dtype: str
    high: int | None = None


@dataclass(frozen=True)
class TokenWarmupInput:
    """A token model's warmup entry: a batch of `batch` prompts of `prompt_tokens` tokens."""

    prompt_tokens: int
    batch: int = 1


@dataclass(frozen=True)
class ModelEntry:
    id: str
    version: str
    weights: Path
    files: tuple[Path, ...]
    builder: str  # torch only ("" for a checkpoint runtime)
    builder_args: dict[str, Any]
    warmup: tuple[WarmupInput, ...] | tuple[TokenWarmupInput, ...]
    size_bytes: int
    pinned: bool = False
    min_replicas: int = 0
    max_rate_per_replica: float | None = None
    description: str = ""
    fallback: str | None = None  # a model id the route hook offers while this one is cold (no cycles)
    priority: str = priorities.DEFAULT  # prewarm.priority.LEVELS: the order of loads waiting on a busy GPU
    max_replica_age_s: float | None = None  # a replica older than this is replaced (make-before-break)
    # The catalog's model roots (resolved): every reader of the weights checks each file against them
    # when it opens it (prewarm.model_roots), not only here when the catalog is read.
    roots: tuple[Path, ...] = ()
    runtime: str = "torch"  # one of prewarm.engines.RUNTIMES; for the others `weights` is the checkpoint dir
    kv_cache_bytes: int = 0  # vllm: the engine's KV cache, counted in size_bytes
    cuda_graphs: bool = False  # torch: capture each warmup shape as a CUDA graph on CUDA devices
    # vllm: the engine's LoRA slots (--max-loras), CPU cache (--max-cpu-loras) and --max-lora-rank, used
    # when the catalog has adapters for it (Catalog.adapters_of)
    max_adapters: int = 0
    max_cpu_adapters: int = 0
    max_lora_rank: int = 0
    # vllm-adapter: the catalog id of its base (a vllm entry) and its LoRA rank; `weights` is its directory
    base: str | None = None
    rank: int = 0

    @property
    def is_adapter(self) -> bool:
        return self.runtime == ADAPTER_RUNTIME

    @property
    def shards(self) -> int:
        return len(self.files)

    @property
    def key(self) -> str:
        return f"{self.id}@{self.version}"

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "version": self.version, "size_bytes": self.size_bytes, "shards": self.shards,
                "weights": str(self.weights), "builder": self.builder, "pinned": self.pinned,
                "min_replicas": self.min_replicas, "max_rate_per_replica": self.max_rate_per_replica,
                "warmup": [{"prompt_tokens": w.prompt_tokens, "batch": w.batch} if isinstance(w, TokenWarmupInput)
                           else {"shape": list(w.shape), "dtype": w.dtype} for w in self.warmup],
                "description": self.description, "runtime": self.runtime, "kv_cache_bytes": self.kv_cache_bytes,
                "fallback": self.fallback, "priority": self.priority,
                "max_replica_age_s": self.max_replica_age_s, "cuda_graphs": self.cuda_graphs,
                **({"max_adapters": self.max_adapters, "max_cpu_adapters": self.max_cpu_adapters,
                    "max_lora_rank": self.max_lora_rank} if self.runtime == "vllm" else {}),
                **({"base": self.base, "rank": self.rank} if self.is_adapter else {})}


@dataclass
class Catalog:
    path: Path
    models: list[ModelEntry] = field(default_factory=list)
    # Entries left out by a lenient load, each with what is wrong ("model 'x': weights: ..."), so one
    # broken model does not take the healthy ones down with it in a running system; an entry kept
    # without its bad fallback is named here too.
    problems: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The first entry listed for an id is its current version; later ones are rollout candidates.
        self._by_key = {m.key: m for m in self.models}
        self._current: dict[str, ModelEntry] = {}
        for m in self.models:
            self._current.setdefault(m.id, m)

    def ids(self) -> list[str]:
        return list(self._current)

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._current

    def get(self, model_id: str, version: str | None = None) -> ModelEntry:
        if version is None:
            if model_id not in self._current:
                raise KeyError(f"unknown model {model_id!r}: `prewarm models list` shows the catalog")
            return self._current[model_id]
        key = f"{model_id}@{version}"
        if key not in self._by_key:
            raise KeyError(f"unknown model version {key!r}: add it to the catalog {self.path}")
        return self._by_key[key]

    def versions(self, model_id: str) -> list[ModelEntry]:
        return [m for m in self.models if m.id == model_id]

    def adapters_of(self, base_id: str) -> list[ModelEntry]:
        """The current entries of the adapters whose base is `base_id` (its engine starts with LoRA
        enabled when there is any)."""
        return [m for m in self._current.values() if m.base == base_id]

