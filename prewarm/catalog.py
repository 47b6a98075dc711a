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

This module reads the file; the records it makes are in prewarm.catalog_entries, the numeric bounds in
prewarm.catalog_bounds and the reading of the warmup tables in prewarm.catalog_warmup.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from prewarm import priority as priorities
from prewarm.catalog_bounds import BOUNDS, check_number, in_bounds
from prewarm.catalog_entries import (
    ADAPTER_RUNTIME,
    Catalog,
    CatalogError,
    ModelEntry,
    TokenWarmupInput,
    entry_error,
)
from prewarm.catalog_warmup import parse_token_warmup, parse_warmup
from prewarm.engines import DEFAULT_KV_CACHE_BYTES, DEFAULT_VLLM_ENGINE_BYTES, RUNTIMES
from prewarm.model_roots import RefusedFile, open_inside, within
from prewarm.safetensors_header import SafetensorsError, read_header, weight_files
from prewarm.units import parse_duration

_COMMON_KEYS = {"id", "version", "runtime", "warmup", "pinned", "min_replicas", "max_rate_per_replica",
                "description", "fallback", "priority", "max_replica_age"}
CATALOG_RUNTIMES = (*RUNTIMES, ADAPTER_RUNTIME)
# The keys each runtime takes besides the common ones (one home: the error lists them from here).
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
_TOP_KEYS = {"models", "roots"}
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_BUILDER_RE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*")
log = logging.getLogger(__name__)


def _check_builder(where: str, builder: object) -> str:
    if not isinstance(builder, str) or not _BUILDER_RE.fullmatch(builder):
        raise entry_error(where, f"builder {builder!r} is not an import path; write package.module:function")
    module = builder.split(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise entry_error(where, f"builder module {module!r} cannot be found ({exc})") from None
    if spec is None:
        raise entry_error(where, f"builder module {module!r} cannot be found; check the import path")
    return builder


def _parse_checkpoint_entry(where: str, raw: dict[str, Any], runtime: str, base: Path, roots: list[Path],
                            check_files: bool) -> tuple[Path, tuple[Path, ...], int, int, tuple[TokenWarmupInput, ...]]:
    """A transformers / vllm entry's checkpoint directory, its weight files, size and warmup."""
    path_raw = raw.get("path")
    if not isinstance(path_raw, str) or not path_raw:
        raise entry_error(where, f"runtime {runtime!r} needs path = a Hugging Face checkpoint directory (config.json "
                                 "and model.safetensors, or shards with model.safetensors.index.json)")
    path = (base / path_raw).resolve()
    if not within(path, roots):
        raise entry_error(where, f"path {path_raw!r} lies outside the model roots {[str(r) for r in roots]}")
    kv = engine = 0
    if runtime == "vllm":
        kv = check_number(where, "kv_cache_bytes", raw.get("kv_cache_bytes", DEFAULT_KV_CACHE_BYTES))
        engine = check_number(where, "engine_bytes", raw.get("engine_bytes", DEFAULT_VLLM_ENGINE_BYTES))
    files: tuple[Path, ...] = ()
    size = 0
    if check_files:
        if not path.is_dir():
            raise entry_error(where, f"path {path} is not a directory; runtime {runtime!r} serves a checkpoint directory")
        files, size = _weights_read(where, "checkpoint weights", path, roots)
    return path, files, size + kv + engine, kv, parse_token_warmup(where, raw.get("warmup"))


def _lora_slots(where: str, raw: dict[str, Any]) -> dict[str, int]:
    """A vllm entry's LoRA settings: max_adapters, max_cpu_adapters (at least max_adapters, as vLLM
    requires) and max_lora_rank (one of vLLM's choices)."""
    slots = check_number(where, "max_adapters", raw.get("max_adapters", DEFAULT_MAX_ADAPTERS))
    cpu = check_number(where, "max_cpu_adapters", raw.get("max_cpu_adapters", slots))
    if cpu < slots:
        raise entry_error(where, f"max_cpu_adapters ({cpu}) must be at least max_adapters ({slots}): the engine's CPU "
                                 "cache holds every adapter in its slots (vLLM refuses to start otherwise)")
    rank = raw.get("max_lora_rank", DEFAULT_MAX_LORA_RANK)
    if isinstance(rank, bool) or rank not in LORA_RANKS:
        raise entry_error(where, f"max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's choices), "
                                 f"got {rank!r}")
    return {"max_adapters": slots, "max_cpu_adapters": cpu, "max_lora_rank": rank}


def _parse_adapter_entry(where: str, raw: dict[str, Any], model_id: str, version: str, base_dir: Path,
                         roots: list[Path], check_files: bool) -> ModelEntry:
    """A vllm-adapter entry: its base's id (checked against the catalog once every entry is read), its PEFT
    directory inside the roots (adapter_config.json whose "r" is `rank`, adapter_model.safetensors parsed)."""
    base = raw.get("base")
    if not isinstance(base, str) or not _ID_RE.fullmatch(base):
        raise entry_error(where, f"runtime {ADAPTER_RUNTIME!r} needs base = the catalog id of the vllm model it "
                                 f"adapts, got {base!r}")
    if base == model_id:
        raise entry_error(where, "base names the adapter itself; name the vllm model it is loaded into")
    path_raw = raw.get("path")
    if not isinstance(path_raw, str) or not path_raw:
        raise entry_error(where, f"runtime {ADAPTER_RUNTIME!r} needs path = a PEFT adapter directory ({ADAPTER_CONFIG} "
                                 f"and {ADAPTER_WEIGHTS})")
    path = (base_dir / path_raw).resolve()
    if not within(path, roots):
        raise entry_error(where, f"path {path_raw!r} lies outside the model roots {[str(r) for r in roots]}")
    if "rank" not in raw:
        raise entry_error(where, f"missing required key 'rank' (the adapter's LoRA rank: {ADAPTER_CONFIG}'s \"r\")")
    rank = check_number(where, "rank", raw["rank"])
    files: tuple[Path, ...] = ()
    size = 0
    if check_files:
        if not path.is_dir():
            raise entry_error(where, f"path {path} is not a directory; an adapter is a PEFT directory with "
                                     f"{ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
        _check_adapter_config(where, path / ADAPTER_CONFIG, rank, roots)
        weights = path / ADAPTER_WEIGHTS
        if not weights.exists():
            raise entry_error(where, f"{weights} does not exist; PEFT saves an adapter's weights there "
                                     "(save_pretrained with safe_serialization)")
        files, size = _weights_read(where, "adapter weights", weights, roots)
    warmup = parse_token_warmup(where, raw["warmup"]) if "warmup" in raw else (TokenWarmupInput(16, 1),)
    return ModelEntry(id=model_id, version=version, weights=path, files=files, builder="", builder_args={},
                      warmup=warmup, size_bytes=size, runtime=ADAPTER_RUNTIME, **_common(where, raw),
                      roots=tuple(roots), base=base, rank=rank)


def _check_adapter_config(where: str, path: Path, rank: int, roots: list[Path]) -> None:
    """adapter_config.json: opened inside the roots, a JSON table whose "r" (when present) is `rank`."""
    try:
        fd = open_inside(path, roots)
    except FileNotFoundError:
        raise entry_error(where, f"{path} does not exist; a PEFT adapter directory has {ADAPTER_CONFIG}") from None
    except (RefusedFile, OSError) as exc:
        raise entry_error(where, f"{ADAPTER_CONFIG}: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        text = f.read(MAX_ADAPTER_CONFIG_BYTES + 1)
    if len(text) > MAX_ADAPTER_CONFIG_BYTES:
        raise entry_error(where, f"{path} is over {MAX_ADAPTER_CONFIG_BYTES:,} bytes; not a PEFT adapter config")
    try:
        cfg = json.loads(text)
    except (ValueError, RecursionError):
        raise entry_error(where, f"{path} is not valid JSON; write the adapter with PEFT's save_pretrained") from None
    if not isinstance(cfg, dict):
        raise entry_error(where, f"{path} must hold a JSON object (PEFT's LoraConfig)")
    r = cfg.get("r")
    if r is not None and r != rank:
        raise entry_error(where, f"rank = {rank} but {ADAPTER_CONFIG} says r = {r!r}; make them agree")


def _weights_read(where: str, label: str, weights: Path, roots: list[Path]) -> tuple[tuple[Path, ...], int]:
    """An entry's weight files and their data bytes, each file opened inside the roots (a shard symlinked
    out of them is refused); a malformed file or index, or one that cannot be read, is this entry's error."""
    try:
        files = tuple(weight_files(weights, roots))
        return files, sum(read_header(f, roots).data_bytes for f in files)
    except (SafetensorsError, OSError) as exc:
        raise entry_error(where, f"{label}: {exc}") from None


def _entry_name(i: int, raw: object) -> str:
    """The key an entry's problem is filed under: its id, or its place when it has none."""
    return raw["id"] if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"models[{i}]"


def _unexpected(i: int, raw: object, exc: Exception) -> CatalogError:
    """An exception no check of the entry names (a bug, or a reader letting an error through): still only
    this entry's error, named with its type, and its traceback logged so the bug is not lost."""
    name = _entry_name(i, raw)
    log.error("catalog entry %s: unexpected %s while reading it", name, type(exc).__name__, exc_info=exc)
    where = f"model {name!r}" if not name.startswith("models[") else name
    return entry_error(where, f"unexpected {type(exc).__name__} while reading the entry: {exc} (no check names this "
                              "error: its traceback is in the log)")


def _parse_entry(i: int, raw: object, base: Path, roots: list[Path], check_files: bool) -> ModelEntry:
    where = f"models[{i}]"
    if not isinstance(raw, dict):
        raise entry_error(where, "must be a [[models]] table")
    model_id = raw.get("id")
    if not isinstance(model_id, str) or not _ID_RE.fullmatch(model_id):
        raise entry_error(where, f"id {model_id!r} must be 1-128 letters, digits, '.', '_' or '-'")
    where = f"model {model_id!r}"
    unknown = set(raw) - _MODEL_KEYS
    if unknown:
        raise entry_error(where, f"unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(_MODEL_KEYS))}")
    runtime = raw.get("runtime", "torch")
    if runtime not in CATALOG_RUNTIMES:
        raise entry_error(where, f"runtime {runtime!r} is not one of {', '.join(CATALOG_RUNTIMES)}")
    foreign = set(raw) - _COMMON_KEYS - _RUNTIME_KEYS[runtime]
    if foreign:
        raise entry_error(where, f"key {sorted(foreign)[0]!r} does not apply to runtime {runtime!r}; it takes "
                                 f"{', '.join(sorted(_RUNTIME_KEYS[runtime]))} besides the common keys")
    if "version" not in raw:
        raise entry_error(where, "missing required key 'version'")
    version = raw["version"]
    if not isinstance(version, str) or not _ID_RE.fullmatch(version):
        raise entry_error(where, f"version {version!r} must be 1-128 letters, digits, '.', '_' or '-'")
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
            raise entry_error(where, f"missing required key {key!r}")
    weights_raw = raw["weights"]
    if not isinstance(weights_raw, str) or not weights_raw:
        raise entry_error(where, "weights must be a path to a .safetensors file or a model.safetensors.index.json")
    weights = (base / weights_raw).resolve()
    if not within(weights, roots):
        raise entry_error(where, f"weights {weights_raw!r} lie outside the model roots {[str(r) for r in roots]}")
    if not (weights.name.endswith(".safetensors") or weights.name.endswith(".safetensors.index.json")):
        raise entry_error(where, f"weights {weights_raw!r} must be .safetensors or .safetensors.index.json "
                                 "(nothing else is loaded: no pickles)")
    files: tuple[Path, ...] = ()
    size = 0
    if check_files:
        if not weights.exists():
            raise entry_error(where, f"weights file {weights} does not exist")
        files, size = _weights_read(where, "weights", weights, roots)
    builder = _check_builder(where, raw["builder"])
    builder_args = raw.get("builder_args", {})
    if not isinstance(builder_args, dict):
        raise entry_error(where, "builder_args must be a table of keyword arguments")
    warmup = parse_warmup(where, raw.get("warmup"))
    graphs = raw.get("cuda_graphs", False)
    if not isinstance(graphs, bool):
        raise entry_error(where, f"cuda_graphs {graphs!r} must be true or false")
    return ModelEntry(id=model_id, version=version, weights=weights, files=files, builder=builder,
                      builder_args=dict(builder_args), warmup=warmup, size_bytes=size, **_common(where, raw),
                      roots=tuple(roots), cuda_graphs=graphs)


def _common(where: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The fields every runtime's entry has: pinned, min_replicas, max_rate_per_replica, description."""
    pinned = raw.get("pinned", False)
    if not isinstance(pinned, bool):
        raise entry_error(where, f"pinned {pinned!r} must be true or false")
    min_replicas = check_number(where, "min_replicas", raw.get("min_replicas", 0))
    cap = raw.get("max_rate_per_replica")
    if cap is not None:
        check_number(where, "max_rate_per_replica", cap)
    fallback = raw.get("fallback")
    if fallback is not None and (not isinstance(fallback, str) or not _ID_RE.fullmatch(fallback)):
        raise entry_error(where, f"fallback {fallback!r} must be the id of another model in the catalog")
    try:
        priority = priorities.check(raw.get("priority", priorities.DEFAULT), "priority")
    except ValueError:
        raise entry_error(where, f"priority {raw.get('priority')!r} must be one of {', '.join(priorities.LEVELS)} "
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
        raise entry_error(where, f"max_replica_age {raw!r} must be a duration such as 90s, 30m or 6h")
    try:
        seconds = parse_duration(str(raw))
    except ValueError:
        raise entry_error(where, f"max_replica_age {raw!r} must be a duration such as 90s, 30m or 6h") from None
    b = BOUNDS["max_replica_age"]
    if not in_bounds(seconds, b):  # e.g. a 400-digit number of seconds reads as inf
        raise entry_error(where, f"max_replica_age must be a duration between {b.low:g} s and {b.high / 86400:g} days, "
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
                raise entry_error(f"model {entry.id!r}", f"duplicate id (version {entry.version!r} is listed twice)")
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
