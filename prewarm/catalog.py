"""The model catalog: a TOML file listing the models prewarm may place on GPUs.

    roots = ["."]                    # optional: folders weights must lie in (default: the catalog's folder)

    [[models]]
    id = "lm-small"                  # unique with its version
    version = "v1"
    weights = "lm-small/model.safetensors"   # or ".../model.safetensors.index.json" for a sharded set
    builder = "gpu_worker.demo_models:build_lm"   # package.module:function -> torch.nn.Module
    builder_args = { d_model = 512, n_layers = 6 }  # optional keyword arguments for the builder
    cuda_graphs = false              # optional: on CUDA, capture each warmup shape as a CUDA graph and replay
                                     # it for requests of that shape (ignored on CPU, with a note)
    pinned = false                   # optional: never evicted, kept resident
    min_replicas = 0                 # optional: replicas kept ready at all times
    max_rate_per_replica = 50.0      # optional: requests/s one replica serves; more traffic adds replicas
    fallback = "lm-tiny"             # optional: a model the router may serve from while this one is cold
    priority = "normal"              # optional: high | normal | low: whose load goes first on a busy GPU
    max_replica_age = "6h"           # optional: replace a replica this old (make-before-break): 90s, 30m, 6h
    [[models.warmup]]                # one or more sample inputs run before the replica is ready
    shape = [1, 64]                  # at most MAX_INPUT_DIMS (8) dims and MAX_INPUT_ELEMENTS (4,194,304) elements
    dtype = "int64"
    high = 32000                     # optional: integer inputs are drawn from [0, high)

A Hugging Face checkpoint is served by another runtime (default `runtime = "torch"`, the entries above):

    [[models]]
    id = "tiny-chat"
    version = "v1"
    runtime = "transformers"         # or "vllm": an engine process per replica (prewarm engines)
    path = "tiny-chat"               # the checkpoint directory: config.json + model.safetensors (or shards)
    kv_cache_bytes = 268435456       # vllm only: the engine's KV cache on top of the weights
    engine_bytes = 2147483648        # vllm only: what the engine's processes hold besides (default 2 GiB)
    max_adapters = 4                 # vllm only: LoRA slots (--max-loras): adapters resident at once
    max_cpu_adapters = 8             # vllm only: the engine's CPU cache of adapters (--max-cpu-loras)
    max_lora_rank = 16               # vllm only: the largest adapter rank it takes (--max-lora-rank)
    [[models.warmup]]
    prompt_tokens = 16               # a batch of `batch` prompts of this many tokens
    batch = 1                        # prompt_tokens x batch: at most MAX_INPUT_TOKENS (65,536)

A LoRA adapter of a vllm model is an entry of its own (`runtime = "vllm-adapter"`), served inside a ready
replica of its base (no engine of its own: loaded at run time through vLLM's /v1/load_lora_adapter):

    [[models]]
    id = "tiny-llama-vllm-lora-a"    # also its name in the OpenAI API (the `model` of a request)
    version = "v1"
    runtime = "vllm-adapter"
    base = "tiny-llama-vllm"         # the catalog id of a vllm model: the engine it is loaded into
    path = "lora-a"                  # a PEFT adapter directory: adapter_config.json + adapter_model.safetensors
    rank = 8                         # its LoRA rank (adapter_config.json's "r" must say the same)
    # [[models.warmup]] is optional here (default: one 16-token prompt), run through the adapter

An adapter is checked when the catalog is read: its base is an entry of the catalog with runtime "vllm",
its rank is at most the base's max_lora_rank, its files lie inside the model roots, adapter_config.json is
a JSON table whose "r" is the rank, and adapter_model.safetensors parses. A base whose catalog has
adapters is started with LoRA enabled (--enable-lora --max-loras max_adapters --max-cpu-loras
max_cpu_adapters --max-lora-rank max_lora_rank); one without runs as before.

Every numeric field is checked to be finite and within its range (a value outside it is that entry's
error, naming the field, its range and the value; a lenient load serves the other entries):

    min_replicas            integer, 0 to 64
    max_rate_per_replica    number, 0.001 to 1e6 (requests/s)
    max_replica_age         duration, 1 s to 365 days
    warmup                  1 to 16 entries; shape: 1 to 8 dimensions, at most 4,194,304 elements in
                            all; high: integer, 1 to 2,147,483,648; prompt_tokens: integer, 1 to 65,536;
                            batch: integer, 1 to 4,096; prompt_tokens x batch at most 65,536
    kv_cache_bytes          integer, 1 to 17,592,186,044,416 (16 TiB)
    engine_bytes            integer, 0 to 17,592,186,044,416 (16 TiB)
    max_adapters            integer, 1 to 256 (default 4)
    max_cpu_adapters        integer, max_adapters to 4,096 (default max_adapters)
    max_lora_rank           one of 1, 8, 16, 32, 64, 128, 256, 320, 512 (vLLM's choices; default 16)
    rank                    integer, 1 to 512, at most the base's max_lora_rank

A checkpoint's config.json is read by its runtime when a replica is loaded (a missing one fails that
replica with the reason); here only its weights' headers are validated. A vllm entry's size_bytes is its
weights plus kv_cache_bytes plus engine_bytes: what the placement gives it room for (the worker then commits
what the engine measures itself to hold).

Warmup inputs are bounded (an entry past a bound is refused, naming the field and the bound; a lenient
load serves the others): at most MAX_WARMUP_INPUTS (16) per entry, each the size of a request the runtime
would take (the worker's `infer` checks requests against the same bounds). The memory the warmup passes
need is counted against the GPU when a replica warms (gpu_worker/runtimes/warmup_memory.py).

Loading validates every entry and names the entry and field at fault. Sizes come from the safetensors
headers (exact data bytes), read without torch so web and scheduler can load the catalog too.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prewarm import priority as priorities
from prewarm.config import parse_duration
from prewarm.engines import DEFAULT_KV_CACHE_BYTES, DEFAULT_VLLM_ENGINE_BYTES, RUNTIMES
from prewarm.model_roots import RefusedFile, open_inside, within
from prewarm.safetensors_header import SafetensorsError, read_header, weight_files

WARMUP_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")
# Bounds on what a model is asked to run (one home: the catalog's warmup entries and the worker's infer
# requests check against these). A [1000000, 64] warmup on a tiny MLP once cost the worker 1.8 GB.
MAX_INPUT_ELEMENTS = 1 << 22  # elements of one torch input (the product of its shape): 16 MiB of float32
MAX_INPUT_DIMS = 8
MAX_INPUT_TOKENS = 1 << 16  # tokens of one checkpoint-runtime input (prompt_tokens x batch)
MAX_WARMUP_INPUTS = 16  # warmup entries per model: each may take PREWARM_WARMUP_MAX_SECONDS
_COMMON_KEYS = {"id", "version", "runtime", "warmup", "pinned", "min_replicas", "max_rate_per_replica",
                "description", "fallback", "priority", "max_replica_age"}
# The keys each runtime takes besides the common ones (one home: the error lists them from here).
ADAPTER_RUNTIME = "vllm-adapter"  # a LoRA adapter served inside a ready replica of its vllm base
CATALOG_RUNTIMES = (*RUNTIMES, ADAPTER_RUNTIME)
_RUNTIME_KEYS = {"torch": {"weights", "builder", "builder_args", "cuda_graphs"},
                 "transformers": {"path"},
                 "vllm": {"path", "kv_cache_bytes", "engine_bytes", "max_adapters", "max_cpu_adapters",
                          "max_lora_rank"},
                 ADAPTER_RUNTIME: {"base", "path", "rank"}}
ADAPTER_CONFIG = "adapter_config.json"  # PEFT's names for an adapter directory's two files
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_ADAPTER_CONFIG_BYTES = 1 << 20  # adapter_config.json is a few hundred bytes; a huge one is not PEFT's
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's --max-lora-rank choices (vllm/config/lora.py)
DEFAULT_MAX_ADAPTERS = 4
DEFAULT_MAX_LORA_RANK = 16
_MODEL_KEYS = _COMMON_KEYS | set().union(*_RUNTIME_KEYS.values())
_WARMUP_KEYS = {"shape", "dtype", "high"}
_TOKEN_WARMUP_KEYS = {"prompt_tokens", "batch"}
_TOP_KEYS = {"models", "roots"}
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_BUILDER_RE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bound:
    """A numeric field's range (inclusive): every real fleet's values lie well inside it, and a value out
    of it (nan, inf, 5e-324, a typo's extra digits) would only break what reads it later (the planner
    divides by max_rate_per_replica; the worker allocates warmup shapes)."""

    low: float
    high: float
    integer: bool = False
    unit: str = ""  # shown after the range, e.g. "requests/s"

    def text(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        unit = f" ({self.unit})" if self.unit else ""
        return f"{kind} between {_show(self.low)} and {_show(self.high)}{unit}"


def _show(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


TIB = 1 << 40
# One home for every numeric field's range (the module docstring and the README list them).
BOUNDS: dict[str, Bound] = {
    "min_replicas": Bound(0, 64, integer=True),
    "max_rate_per_replica": Bound(0.001, 1e6, unit="requests/s"),
    # a duration: _max_age words it; under 1 s a replica would reload about as fast as it loads
    "max_replica_age": Bound(1.0, 365 * 86400.0, unit="seconds"),
    "warmup_entries": Bound(1, MAX_WARMUP_INPUTS, integer=True),
    "shape": Bound(1, MAX_INPUT_ELEMENTS, integer=True),  # each dimension
    "high": Bound(1, 1 << 31, integer=True),
    "prompt_tokens": Bound(1, MAX_INPUT_TOKENS, integer=True),
    "batch": Bound(1, 4096, integer=True),
    "kv_cache_bytes": Bound(1, 16 * TIB, integer=True, unit="bytes, up to 16 TiB"),
    "engine_bytes": Bound(0, 16 * TIB, integer=True, unit="bytes, up to 16 TiB"),
    "max_adapters": Bound(1, 256, integer=True),
    "max_cpu_adapters": Bound(1, 4096, integer=True),
    "rank": Bound(1, 512, integer=True),
}


def check_number(where: str, name: str, raw: object) -> Any:
    """`raw` if it is a number within BOUNDS[name], else the entry's CatalogError:
    "max_rate_per_replica must be a finite number between 0.001 and 1,000,000 (requests/s), got nan".
    A bool is not a number here (TOML's true is not 1)."""
    b = BOUNDS[name]
    if _within(raw, b):
        return raw
    raise _fail(where, f"{name} must be {b.text()}, got {raw!r}")


def _within(raw: object, b: Bound) -> bool:
    if isinstance(raw, bool) or not isinstance(raw, int if b.integer else int | float):
        return False
    # an int is exact (and may be too large for a float); a float must be finite
    return (isinstance(raw, int) or math.isfinite(raw)) and b.low <= raw <= b.high  # type: ignore[operator]


def _warmup_list(where: str, raw: object, what: str) -> list:
    """The [[models.warmup]] tables: a list of 1 to BOUNDS["warmup_entries"].high of them."""
    if not isinstance(raw, list) or not raw:
        raise _fail(where, f"warmup must be a non-empty list of [[models.warmup]] tables with {what}")
    most = BOUNDS["warmup_entries"].high
    if len(raw) > most:
        raise _fail(where, f"warmup has {len(raw):,} entries; at most {_show(most)} (each runs at every load)")
    return raw


def _check_shape(where: str, shape: object) -> tuple[int, ...]:
    each = BOUNDS["shape"]
    if not isinstance(shape, list) or not shape or not all(_within(d, each) for d in shape):
        raise _fail(where, f"shape {shape!r} must be a non-empty list of integers, each between {_show(each.low)} "
                           f"and {_show(each.high)}")
    if (too_big := check_input_shape(shape)) is not None:
        raise _fail(where, f"shape {shape!r} {too_big}: warm with a shape a request would have")
    return tuple(shape)


class CatalogError(ValueError):
    """A catalog that cannot be used; the message names the entry and field at fault."""


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


def _fail(where: str, msg: str) -> CatalogError:
    return CatalogError(f"{where}: {msg}")


def _check_builder(where: str, builder: object) -> str:
    if not isinstance(builder, str) or not _BUILDER_RE.fullmatch(builder):
        raise _fail(where, f"builder {builder!r} is not an import path; write package.module:function")
    module = builder.split(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise _fail(where, f"builder module {module!r} cannot be found ({exc})") from None
    if spec is None:
        raise _fail(where, f"builder module {module!r} cannot be found; check the import path")
    return builder


def check_input_shape(shape: list[int] | tuple[int, ...]) -> str | None:
    """Why a torch input of `shape` (positive integers) is too large, or None when it is within the bounds."""
    if len(shape) > MAX_INPUT_DIMS:
        return f"has {len(shape)} dims; at most {MAX_INPUT_DIMS} (MAX_INPUT_DIMS) are allowed"
    n = math.prod(shape)
    if n > MAX_INPUT_ELEMENTS:
        return f"has {n:,} elements; at most {MAX_INPUT_ELEMENTS:,} (MAX_INPUT_ELEMENTS) are allowed per input"
    return None


def _parse_warmup(where: str, raw: object) -> tuple[WarmupInput, ...]:
    out = []
    for i, w in enumerate(_warmup_list(where, raw, "shape and dtype")):
        wh = f"{where} warmup[{i}]"
        if not isinstance(w, dict):
            raise _fail(wh, "must be a table with shape and dtype")
        unknown = set(w) - _WARMUP_KEYS
        if unknown:
            raise _fail(wh, f"unknown key {sorted(unknown)[0]!r}; allowed: {sorted(_WARMUP_KEYS)}")
        shape = _check_shape(wh, w.get("shape"))
        dtype = w.get("dtype", "float32")
        if dtype not in WARMUP_DTYPES:
            raise _fail(wh, f"dtype {dtype!r} is not one of {', '.join(WARMUP_DTYPES)}")
        high = w.get("high")
        if high is not None:
            check_number(wh, "high", high)
        out.append(WarmupInput(shape, dtype, high))
    return tuple(out)


def _parse_token_warmup(where: str, raw: object) -> tuple[TokenWarmupInput, ...]:
    out = []
    for i, w in enumerate(_warmup_list(where, raw, "prompt_tokens (and batch)")):
        wh = f"{where} warmup[{i}]"
        if not isinstance(w, dict):
            raise _fail(wh, "must be a table with prompt_tokens and batch")
        unknown = set(w) - _TOKEN_WARMUP_KEYS
        if unknown:
            raise _fail(wh, f"unknown key {sorted(unknown)[0]!r}; a checkpoint runtime's warmup takes "
                            f"{', '.join(sorted(_TOKEN_WARMUP_KEYS))}")
        n = check_number(wh, "prompt_tokens", w.get("prompt_tokens"))
        b = check_number(wh, "batch", w.get("batch", 1))
        if n * b > MAX_INPUT_TOKENS:
            raise _fail(wh, f"prompt_tokens x batch = {n} x {b} = {n * b:,} tokens; at most {MAX_INPUT_TOKENS:,} "
                            "(MAX_INPUT_TOKENS) are allowed per input")
        out.append(TokenWarmupInput(n, b))
    return tuple(out)


def _parse_checkpoint_entry(where: str, raw: dict[str, Any], runtime: str, base: Path, roots: list[Path],
                            check_files: bool) -> tuple[Path, tuple[Path, ...], int, int, tuple[TokenWarmupInput, ...]]:
    """A transformers / vllm entry's checkpoint directory, its weight files, size and warmup."""
    path_raw = raw.get("path")
    if not isinstance(path_raw, str) or not path_raw:
        raise _fail(where, f"runtime {runtime!r} needs path = a Hugging Face checkpoint directory (config.json "
                           "and model.safetensors, or shards with model.safetensors.index.json)")
    path = (base / path_raw).resolve()
    if not within(path, roots):
        raise _fail(where, f"path {path_raw!r} lies outside the model roots {[str(r) for r in roots]}")
    kv = engine = 0
    if runtime == "vllm":
        kv = check_number(where, "kv_cache_bytes", raw.get("kv_cache_bytes", DEFAULT_KV_CACHE_BYTES))
        engine = check_number(where, "engine_bytes", raw.get("engine_bytes", DEFAULT_VLLM_ENGINE_BYTES))
    files: tuple[Path, ...] = ()
    size = 0
    if check_files:
        if not path.is_dir():
            raise _fail(where, f"path {path} is not a directory; runtime {runtime!r} serves a checkpoint directory")
        files, size = _weights_read(where, "checkpoint weights", path, roots)
    return path, files, size + kv + engine, kv, _parse_token_warmup(where, raw.get("warmup"))


def _lora_slots(where: str, raw: dict[str, Any]) -> dict[str, int]:
    """A vllm entry's LoRA settings: max_adapters, max_cpu_adapters (at least max_adapters, as vLLM
    requires) and max_lora_rank (one of vLLM's choices)."""
    slots = check_number(where, "max_adapters", raw.get("max_adapters", DEFAULT_MAX_ADAPTERS))
    cpu = check_number(where, "max_cpu_adapters", raw.get("max_cpu_adapters", slots))
    if cpu < slots:
        raise _fail(where, f"max_cpu_adapters ({cpu}) must be at least max_adapters ({slots}): the engine's CPU "
                           "cache holds every adapter in its slots (vLLM refuses to start otherwise)")
    rank = raw.get("max_lora_rank", DEFAULT_MAX_LORA_RANK)
    if isinstance(rank, bool) or rank not in LORA_RANKS:
        raise _fail(where, f"max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's choices), "
                           f"got {rank!r}")
    return {"max_adapters": slots, "max_cpu_adapters": cpu, "max_lora_rank": rank}


def _parse_adapter_entry(where: str, raw: dict[str, Any], model_id: str, version: str, base_dir: Path,
                         roots: list[Path], check_files: bool) -> ModelEntry:
    """A vllm-adapter entry: its base's id (checked against the catalog once every entry is read), its PEFT
    directory inside the roots (adapter_config.json whose "r" is `rank`, adapter_model.safetensors parsed)."""
    base = raw.get("base")
    if not isinstance(base, str) or not _ID_RE.fullmatch(base):
        raise _fail(where, f"runtime {ADAPTER_RUNTIME!r} needs base = the catalog id of the vllm model it "
                           f"adapts, got {base!r}")
    if base == model_id:
        raise _fail(where, "base names the adapter itself; name the vllm model it is loaded into")
    path_raw = raw.get("path")
    if not isinstance(path_raw, str) or not path_raw:
        raise _fail(where, f"runtime {ADAPTER_RUNTIME!r} needs path = a PEFT adapter directory ({ADAPTER_CONFIG} "
                           f"and {ADAPTER_WEIGHTS})")
    path = (base_dir / path_raw).resolve()
    if not within(path, roots):
        raise _fail(where, f"path {path_raw!r} lies outside the model roots {[str(r) for r in roots]}")
    if "rank" not in raw:
        raise _fail(where, f"missing required key 'rank' (the adapter's LoRA rank: {ADAPTER_CONFIG}'s \"r\")")
    rank = check_number(where, "rank", raw["rank"])
    files: tuple[Path, ...] = ()
    size = 0
    if check_files:
        if not path.is_dir():
            raise _fail(where, f"path {path} is not a directory; an adapter is a PEFT directory with "
                               f"{ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
        _check_adapter_config(where, path / ADAPTER_CONFIG, rank, roots)
        weights = path / ADAPTER_WEIGHTS
        if not weights.exists():
            raise _fail(where, f"{weights} does not exist; PEFT saves an adapter's weights there "
                               "(save_pretrained with safe_serialization)")
        files, size = _weights_read(where, "adapter weights", weights, roots)
    warmup = _parse_token_warmup(where, raw["warmup"]) if "warmup" in raw else (TokenWarmupInput(16, 1),)
    return ModelEntry(id=model_id, version=version, weights=path, files=files, builder="", builder_args={},
                      warmup=warmup, size_bytes=size, runtime=ADAPTER_RUNTIME, **_common(where, raw),
                      roots=tuple(roots), base=base, rank=rank)


def _check_adapter_config(where: str, path: Path, rank: int, roots: list[Path]) -> None:
    """adapter_config.json: opened inside the roots, a JSON table whose "r" (when present) is `rank`."""
    try:
        fd = open_inside(path, roots)
    except FileNotFoundError:
        raise _fail(where, f"{path} does not exist; a PEFT adapter directory has {ADAPTER_CONFIG}") from None
    except (RefusedFile, OSError) as exc:
        raise _fail(where, f"{ADAPTER_CONFIG}: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        text = f.read(MAX_ADAPTER_CONFIG_BYTES + 1)
    if len(text) > MAX_ADAPTER_CONFIG_BYTES:
        raise _fail(where, f"{path} is over {MAX_ADAPTER_CONFIG_BYTES:,} bytes; not a PEFT adapter config")
    try:
        cfg = json.loads(text)
    except (ValueError, RecursionError):
        raise _fail(where, f"{path} is not valid JSON; write the adapter with PEFT's save_pretrained") from None
    if not isinstance(cfg, dict):
        raise _fail(where, f"{path} must hold a JSON object (PEFT's LoraConfig)")
    r = cfg.get("r")
    if r is not None and r != rank:
        raise _fail(where, f"rank = {rank} but {ADAPTER_CONFIG} says r = {r!r}; make them agree")


def _weights_read(where: str, label: str, weights: Path, roots: list[Path]) -> tuple[tuple[Path, ...], int]:
    """An entry's weight files and their data bytes, each file opened inside the roots (a shard symlinked
    out of them is refused); a malformed file or index, or one that cannot be read, is this entry's error."""
    try:
        files = tuple(weight_files(weights, roots))
        return files, sum(read_header(f, roots).data_bytes for f in files)
    except (SafetensorsError, OSError) as exc:
        raise _fail(where, f"{label}: {exc}") from None


def _entry_name(i: int, raw: object) -> str:
    """The key an entry's problem is filed under: its id, or its place when it has none."""
    return raw["id"] if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"models[{i}]"


def _unexpected(i: int, raw: object, exc: Exception) -> CatalogError:
    """An exception no check of the entry names (a bug, or a reader letting an error through): still only
    this entry's error, named with its type, and its traceback logged so the bug is not lost."""
    name = _entry_name(i, raw)
    log.error("catalog entry %s: unexpected %s while reading it", name, type(exc).__name__, exc_info=exc)
    where = f"model {name!r}" if not name.startswith("models[") else name
    return _fail(where, f"unexpected {type(exc).__name__} while reading the entry: {exc} (no check names this "
                        "error: its traceback is in the log)")


def _parse_entry(i: int, raw: object, base: Path, roots: list[Path], check_files: bool) -> ModelEntry:
    where = f"models[{i}]"
    if not isinstance(raw, dict):
        raise _fail(where, "must be a [[models]] table")
    model_id = raw.get("id")
    if not isinstance(model_id, str) or not _ID_RE.fullmatch(model_id):
        raise _fail(where, f"id {model_id!r} must be 1-128 letters, digits, '.', '_' or '-'")
    where = f"model {model_id!r}"
    unknown = set(raw) - _MODEL_KEYS
    if unknown:
        raise _fail(where, f"unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(_MODEL_KEYS))}")
    runtime = raw.get("runtime", "torch")
    if runtime not in CATALOG_RUNTIMES:
        raise _fail(where, f"runtime {runtime!r} is not one of {', '.join(CATALOG_RUNTIMES)}")
    foreign = set(raw) - _COMMON_KEYS - _RUNTIME_KEYS[runtime]
    if foreign:
        raise _fail(where, f"key {sorted(foreign)[0]!r} does not apply to runtime {runtime!r}; it takes "
                           f"{', '.join(sorted(_RUNTIME_KEYS[runtime]))} besides the common keys")
    if "version" not in raw:
        raise _fail(where, "missing required key 'version'")
    version = raw["version"]
    if not isinstance(version, str) or not _ID_RE.fullmatch(version):
        raise _fail(where, f"version {version!r} must be 1-128 letters, digits, '.', '_' or '-'")
    if runtime == ADAPTER_RUNTIME:
        return _parse_adapter_entry(where, raw, model_id, version, base, roots, check_files)
    if runtime != "torch":
        path, files, size, kv, token_warmup = _parse_checkpoint_entry(where, raw, runtime, base, roots, check_files)
        return ModelEntry(id=model_id, version=version, weights=path, files=files, builder="", builder_args={},
                          warmup=token_warmup, size_bytes=size, runtime=runtime, kv_cache_bytes=kv,
                          **_common(where, raw), roots=tuple(roots),
                          **(_lora_slots(where, raw) if runtime == "vllm" else {}))
    for key in ("weights", "builder"):
        if key not in raw:
            raise _fail(where, f"missing required key {key!r}")
    weights_raw = raw["weights"]
    if not isinstance(weights_raw, str) or not weights_raw:
        raise _fail(where, "weights must be a path to a .safetensors file or a model.safetensors.index.json")
    weights = (base / weights_raw).resolve()
    if not within(weights, roots):
        raise _fail(where, f"weights {weights_raw!r} lie outside the model roots {[str(r) for r in roots]}")
    if not (weights.name.endswith(".safetensors") or weights.name.endswith(".safetensors.index.json")):
        raise _fail(where, f"weights {weights_raw!r} must be .safetensors or .safetensors.index.json "
                           "(nothing else is loaded: no pickles)")
    files: tuple[Path, ...] = ()
    size = 0
    if check_files:
        if not weights.exists():
            raise _fail(where, f"weights file {weights} does not exist")
        files, size = _weights_read(where, "weights", weights, roots)
    builder = _check_builder(where, raw["builder"])
    builder_args = raw.get("builder_args", {})
    if not isinstance(builder_args, dict):
        raise _fail(where, "builder_args must be a table of keyword arguments")
    warmup = _parse_warmup(where, raw.get("warmup"))
    graphs = raw.get("cuda_graphs", False)
    if not isinstance(graphs, bool):
        raise _fail(where, f"cuda_graphs {graphs!r} must be true or false")
    return ModelEntry(id=model_id, version=version, weights=weights, files=files, builder=builder,
                      builder_args=dict(builder_args), warmup=warmup, size_bytes=size, **_common(where, raw),
                      roots=tuple(roots), cuda_graphs=graphs)


def _common(where: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The fields every runtime's entry has: pinned, min_replicas, max_rate_per_replica, description."""
    pinned = raw.get("pinned", False)
    if not isinstance(pinned, bool):
        raise _fail(where, f"pinned {pinned!r} must be true or false")
    min_replicas = check_number(where, "min_replicas", raw.get("min_replicas", 0))
    cap = raw.get("max_rate_per_replica")
    if cap is not None:
        check_number(where, "max_rate_per_replica", cap)
    fallback = raw.get("fallback")
    if fallback is not None and (not isinstance(fallback, str) or not _ID_RE.fullmatch(fallback)):
        raise _fail(where, f"fallback {fallback!r} must be the id of another model in the catalog")
    try:
        priority = priorities.check(raw.get("priority", priorities.DEFAULT), "priority")
    except ValueError:
        raise _fail(where, f"priority {raw.get('priority')!r} must be one of {', '.join(priorities.LEVELS)} "
                           f"(default {priorities.DEFAULT})") from None
    return {"pinned": pinned, "min_replicas": min_replicas,
            "max_rate_per_replica": None if cap is None else float(cap),
            "description": str(raw.get("description", "")), "fallback": fallback, "priority": priority,
            "max_replica_age_s": _max_age(where, raw.get("max_replica_age"))}


def _max_age(where: str, raw: object) -> float | None:
    """max_replica_age: a duration ("6h", "30m", "90s", or seconds as a number); None: never refreshed."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise _fail(where, f"max_replica_age {raw!r} must be a duration such as 90s, 30m or 6h")
    try:
        seconds = parse_duration(str(raw))
    except ValueError:
        raise _fail(where, f"max_replica_age {raw!r} must be a duration such as 90s, 30m or 6h") from None
    b = BOUNDS["max_replica_age"]
    if not _within(seconds, b):  # e.g. a 400-digit number of seconds reads as inf
        raise _fail(where, f"max_replica_age must be a duration between {b.low:g} s and {b.high / 86400:g} days, "
                           f"got {raw!r}")
    return seconds


def _fallback_problem(models: list[ModelEntry]) -> tuple[ModelEntry, str] | None:
    """The first entry whose fallback names no model of the catalog, or leads back to itself (following
    each model's current entry, the first listed), with what is wrong; None when every chain ends."""
    current: dict[str, ModelEntry] = {}
    for m in models:
        current.setdefault(m.id, m)
    for m in models:
        if m.fallback is None:
            continue
        if m.fallback == m.id:
            return m, f"fallback {m.fallback!r} is the model itself; name another model or leave it out"
        if m.fallback not in current:
            return m, f"fallback {m.fallback!r} is not a model in the catalog; add it or fix the id"
        chain = [m.id]
        name: str | None = m.fallback
        while name is not None:
            chain.append(name)
            if name == m.id:
                return m, f"fallback {m.fallback!r} leads back to {m.id!r} ({' -> '.join(chain)}): a chain of " \
                          "fallbacks must end at a model with none"
            nxt = current.get(name)
            if nxt is None or len(chain) > len(current) + 1:
                break  # an unknown name further on is that entry's own problem
            name = nxt.fallback
    return None


def _adapter_problem(models: list[ModelEntry], problems: dict[str, str]) -> tuple[ModelEntry, str] | None:
    """The first adapter whose base is not a vllm entry of the catalog, or whose rank passes the base's
    max_lora_rank, with what to fix; None when every adapter has a base that takes it."""
    current: dict[str, ModelEntry] = {}
    for m in models:
        current.setdefault(m.id, m)
    for m in models:
        if not m.is_adapter:
            continue
        b = current.get(m.base or "")
        if b is None:
            refused = f" (that entry was refused: {problems[m.base]})" if m.base in problems else ""
            return m, f"base {m.base!r} is not a model in the catalog{refused}; add it or fix the id"
        if b.runtime != "vllm":
            return m, f"base {m.base!r} has runtime {b.runtime!r}; an adapter is loaded into a vllm engine, so its " \
                      "base must be a runtime = \"vllm\" entry"
        if m.rank > b.max_lora_rank:
            return m, f"rank {m.rank} is above its base {b.id!r}'s max_lora_rank {b.max_lora_rank}; raise the " \
                      f"base's max_lora_rank (one of {', '.join(map(str, LORA_RANKS))}) or use a smaller adapter"
    return None


def parse_catalog(text: str, path: Path, *, check_files: bool = True, strict: bool = True) -> Catalog:
    """Parse and validate a catalog. strict: any bad entry refuses the whole file (operators editing it
    want to hear at once); lenient (strict=False): a bad entry is left out and named in `problems`, while
    an unreadable file or a bad top level still refuses the whole catalog."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise CatalogError(f"{path}: not readable TOML: arrays or tables nested too deeply") from None
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise CatalogError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}; allowed: roots, models")
    base = path.resolve().parent
    roots_raw = data.get("roots", ["."])
    if not isinstance(roots_raw, list) or not all(isinstance(r, str) for r in roots_raw):
        raise CatalogError(f"{path}: roots must be a list of folder paths")
    roots = [(base / r).resolve() for r in roots_raw]
    models_raw = data.get("models", [])
    if not isinstance(models_raw, list):
        raise CatalogError(f"{path}: models must be an array of [[models]] tables")
    models: list[ModelEntry] = []
    problems: dict[str, str] = {}
    seen: set[str] = set()
    for i, raw in enumerate(models_raw):
        try:
            entry = _parse_entry(i, raw, base, roots, check_files)
            if entry.key in seen:
                raise _fail(f"model {entry.id!r}", f"duplicate id (version {entry.version!r} is listed twice)")
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, it is this entry's problem only
            problem = exc if isinstance(exc, CatalogError) else _unexpected(i, raw, exc)
            if strict:
                raise CatalogError(f"{path}: {problem}") from None
            problems.setdefault(_entry_name(i, raw), str(problem))
            continue
        seen.add(entry.key)
        models.append(entry)
    # Adapters name their base: checked once every entry is read (lenient: the adapter alone is left out).
    while (bad_adapter := _adapter_problem(models, problems)) is not None:
        entry, problem = bad_adapter
        if strict:
            raise CatalogError(f"{path}: model {entry.id!r}: {problem}")
        problems.setdefault(entry.id, f"model {entry.id!r}: {problem}")
        models.remove(entry)
    # Fallbacks name other entries: checked once all are read. Lenient: a model with a bad fallback stays,
    # without it (its weights are fine; one bad link must not take down the models that fall back to it).
    while (bad := _fallback_problem(models)) is not None:
        entry, problem = bad
        if strict:
            raise CatalogError(f"{path}: model {entry.id!r}: {problem}")
        problems.setdefault(entry.id, f"model {entry.id!r}: {problem} (served without a fallback)")
        models[models.index(entry)] = dataclasses.replace(entry, fallback=None)
    return Catalog(path=path, models=models, problems=problems)


def load_catalog(path: Path | str, *, check_files: bool = True, strict: bool = True) -> Catalog:
    path = Path(path)
    if not path.exists():
        raise CatalogError(f"catalog {path} does not exist: run `prewarm models demo --out DIR` or set "
                           "PREWARM_CATALOG")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"catalog {path} cannot be read: {exc}") from None
    return parse_catalog(text, path, check_files=check_files, strict=strict)
