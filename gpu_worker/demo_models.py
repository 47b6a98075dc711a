"""Demo models: real torch modules with seeded random weights, saved with safetensors, and their catalog.

Two families of builders, referenced from the catalog as `gpu_worker.demo_models:<function>`:

- `build_lm`: a decoder-only transformer language model (token + learned position embeddings, pre-norm
  blocks with causal scaled-dot-product attention and a GELU MLP, untied LM head). Input: int64 token ids
  `[batch, seq]`; output: logits `[batch, seq, vocab]`.
- `build_mlp`: a residual MLP classifier. Input: float32 `[batch, in_features]`; output: `[batch, classes]`.

The modules hold no non-persistent buffers, so a module built on the meta device and filled with
`load_state_dict(..., assign=True)` owns exactly the bytes of its weights file (what the worker measures).

`write_demo(out)` writes every model's weights (one file, or HF-style shards plus
`model.safetensors.index.json`) and `catalog.toml`. Beside them it writes the checkpoint demos
(`CHECKPOINTS`, gpu_worker/demo_hf.py's tiny Llama with its local tokenizer): one served by
`transformers` always, one served by `vllm` only when that engine is installed (prewarm/engines.py);
without it the catalog says so in a comment and `log` says how to install it. Weights are drawn from a torch generator seeded per
model, so the same command writes the same bytes; an up-to-date directory is left as it is.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
INDEX_NAME = "model.safetensors.index.json"
CATALOG_NAME = "catalog.toml"
_STAMP_NAME = ".demo-spec"


# --- model families ------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        heads = [z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v)]
        att = F.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, d_ff: int,
                 max_seq: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_seq = max_seq
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)  # untied: safetensors refuses shared storage

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[-1] > self.max_seq:
            raise ValueError(f"sequence of {ids.shape[-1]} tokens exceeds max_seq {self.max_seq}")
        positions = torch.arange(ids.shape[-1], device=ids.device)
        x = self.tok(ids) + self.pos(positions)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class ResidualMLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, depth: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, hidden)
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU())
                                    for _ in range(depth))
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.out(h)


def _cast(module: nn.Module, dtype: str) -> nn.Module:
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return module.to(DTYPES[dtype])


def build_lm(vocab_size: int = 8192, d_model: int = 256, n_layers: int = 2, n_heads: int = 4,
             d_ff: int | None = None, max_seq: int = 128, dtype: str = "float32") -> nn.Module:
    """A decoder-only transformer LM; parameters are created on the current default device (meta works)."""
    if d_model % n_heads:
        raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
    return _cast(TinyLM(vocab_size, d_model, n_layers, n_heads, d_ff or 4 * d_model, max_seq), dtype)


def build_mlp(in_features: int = 784, hidden: int = 1024, depth: int = 4, classes: int = 10,
              dtype: str = "float32") -> nn.Module:
    """A residual MLP classifier."""
    return _cast(ResidualMLP(in_features, hidden, depth, classes), dtype)


BUILDERS: dict[str, Callable[..., nn.Module]] = {"build_lm": build_lm, "build_mlp": build_mlp}


# --- the demo set ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DemoModel:
    id: str
    version: str
    builder: str  # a function name in this module
    args: dict[str, Any]
    warmup: list[dict[str, Any]]
    shards: int = 1
    description: str = ""
    pinned: bool = False
    min_replicas: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _lm(id: str, version: str, vocab: int, d: int, layers: int, heads: int, *, shards: int = 1,
        dtype: str = "float32", max_seq: int = 128, desc: str = "", **extra: Any) -> DemoModel:
    args = {"vocab_size": vocab, "d_model": d, "n_layers": layers, "n_heads": heads, "max_seq": max_seq,
            "dtype": dtype}
    # A single-request shape and a small batch: enough to warm the kernels without minutes of CPU time.
    warm = [{"shape": [1, min(16, max_seq)], "dtype": "int64", "high": vocab},
            {"shape": [4, min(32, max_seq)], "dtype": "int64", "high": vocab}]
    return DemoModel(id, version, "build_lm", args, warm, shards, desc, extra=extra)


def _mlp(id: str, version: str, inp: int, hidden: int, depth: int, classes: int, *, shards: int = 1,
         desc: str = "") -> DemoModel:
    args = {"in_features": inp, "hidden": hidden, "depth": depth, "classes": classes}
    warm = [{"shape": [1, inp], "dtype": "float32"}, {"shape": [32, inp], "dtype": "float32"}]
    return DemoModel(id, version, "build_mlp", args, warm, shards, desc)


# Sizes (float32 unless noted) from ~23 MB to ~1 GB; lm-medium and lm-large are sharded.
FULL: list[DemoModel] = [
    _lm("lm-tiny", "v1", 8192, 256, 2, 4, desc="2-layer LM, ~23 MB"),
    _lm("lm-mini", "v1", 8192, 384, 4, 6, desc="4-layer LM, ~54 MB"),
    _lm("lm-mini", "v2", 8192, 384, 4, 6, desc="lm-mini retrained (a rollout candidate)"),
    _lm("lm-small", "v1", 8192, 512, 6, 8, desc="6-layer LM, ~110 MB"),
    _lm("chat-small", "v1", 16384, 768, 6, 12, dtype="bfloat16", desc="6-layer bf16 chat LM, ~135 MB"),
    _lm("code-small", "v1", 16384, 512, 8, 8, desc="8-layer code LM, ~170 MB"),
    _lm("lm-base", "v1", 16384, 768, 8, 12, desc="8-layer LM, ~330 MB"),
    _lm("lm-base-fp16", "v1", 16384, 1024, 10, 16, dtype="float16", desc="10-layer fp16 LM, ~320 MB"),
    _lm("lm-medium", "v1", 16384, 1024, 12, 16, shards=2, desc="12-layer LM in 2 shards, ~740 MB"),
    _lm("lm-large", "v1", 16384, 1152, 14, 16, shards=3, desc="14-layer LM in 3 shards, ~1 GB", fallback="lm-small"),
    _mlp("mlp-digits", "v1", 784, 1024, 4, 10, desc="residual MLP classifier, ~20 MB"),
    _mlp("mlp-tabular", "v1", 256, 2048, 6, 32, desc="residual MLP over tabular features, ~104 MB"),
    _mlp("mlp-wide", "v1", 1024, 4096, 3, 100, shards=2, desc="wide residual MLP in 2 shards, ~222 MB"),
]

# The same shapes of catalog at a few hundred KB each: for tests and quick looks.
SMALL: list[DemoModel] = [
    _lm("tiny-lm", "v1", 512, 64, 2, 4, max_seq=64, desc="tiny LM"),
    _lm("tiny-lm", "v2", 512, 64, 2, 4, max_seq=64, desc="tiny LM, second version"),
    _lm("tiny-lm-wide", "v1", 1024, 128, 2, 4, max_seq=64, desc="tiny LM, wider"),
    _lm("tiny-lm-bf16", "v1", 512, 64, 2, 4, max_seq=64, dtype="bfloat16", desc="tiny bf16 LM"),
    _lm("tiny-sharded", "v1", 1024, 128, 3, 4, shards=2, max_seq=64, desc="tiny LM in 2 shards"),
    _lm("tiny-sharded3", "v1", 512, 96, 3, 4, shards=3, max_seq=64, desc="tiny LM in 3 shards"),
    _mlp("tiny-mlp", "v1", 64, 128, 2, 10, desc="tiny MLP"),
]


def demo_set(small: bool = False) -> list[DemoModel]:
    return SMALL if small else FULL


@dataclass(frozen=True)
class CheckpointDemo:
    """A Hugging Face checkpoint demo (the tiny Llama, a few MB): served by `runtime`, not by a builder."""

    id: str
    version: str
    runtime: str  # "transformers" or "vllm"
    seed: int
    description: str
    # Token warmup: one short prompt and a small batch, enough to warm without minutes of CPU time.
    warmup: tuple[dict[str, int], ...] = ({"prompt_tokens": 16, "batch": 1}, {"prompt_tokens": 64, "batch": 2})


# Both in the full and the small demo (they are tiny either way); the vllm one only with the engine.
CHECKPOINTS: list[CheckpointDemo] = [
    CheckpointDemo("tiny-llama-hf", "v1", "transformers", 11,
                   "tiny random Llama (HF checkpoint, local tokenizer) served by transformers in the worker"),
    CheckpointDemo("tiny-llama-vllm", "v1", "vllm", 12,
                   "tiny random Llama served by a vLLM engine process (a replica holds ~2 GB on CPU)"),
]
# The vllm demo model's engine with LoRA: two slots, so a third adapter waits for one to be unloaded.
VLLM_LORA_FIELDS = {"max_adapters": 2, "max_cpu_adapters": 4, "max_lora_rank": 16}


@dataclass(frozen=True)
class AdapterDemo:
    """A small random LoRA adapter of a checkpoint demo (runtime vllm-adapter; gpu_worker/demo_lora.py)."""

    id: str
    base: str
    rank: int
    seed: int
    version: str = "v1"


ADAPTERS: list[AdapterDemo] = [AdapterDemo("tiny-llama-vllm-lora-a", "tiny-llama-vllm", 8, 21),
                               AdapterDemo("tiny-llama-vllm-lora-b", "tiny-llama-vllm", 8, 22),
                               AdapterDemo("tiny-llama-vllm-lora-c", "tiny-llama-vllm", 16, 23)]
VLLM_MISSING = ("the vllm demo model (tiny-llama-vllm) is left out: the vLLM engine is not installed; "
                "run `prewarm engines install vllm`, then `prewarm models demo` again to add it")


def checkpoint_set(vllm: bool) -> list[CheckpointDemo]:
    """The checkpoint demos to write: the vllm one only when its engine is installed."""
    return [c for c in CHECKPOINTS if c.runtime != "vllm" or vllm]


# --- writing -----------------------------------------------------------------------------------------
def _seed(model: DemoModel) -> int:
    return int.from_bytes(hashlib.sha256(f"{model.id}@{model.version}".encode()).digest()[:8], "little") >> 1


def random_state_dict(model: DemoModel) -> dict[str, torch.Tensor]:
    """Seeded weights for the model's exact state dict: N(0, 0.02) matrices, unit LayerNorm gains, zero biases."""
    with torch.device("meta"):
        meta = BUILDERS[model.builder](**model.args)
    gen = torch.Generator().manual_seed(_seed(model))
    out: dict[str, torch.Tensor] = {}
    for name, t in meta.state_dict().items():
        if name.endswith("bias"):
            v = torch.zeros(t.shape, dtype=t.dtype)
        elif t.dim() == 1:  # LayerNorm gains
            v = torch.ones(t.shape, dtype=t.dtype)
        else:
            v = torch.randn(t.shape, generator=gen, dtype=torch.float32).mul_(0.02).to(t.dtype)
        out[name] = v
    return out


def _split(names: list[str], tensors: dict[str, torch.Tensor], shards: int) -> list[list[str]]:
    """Contiguous groups of tensors with about equal bytes."""
    total = sum(tensors[n].nbytes for n in names)
    groups: list[list[str]] = [[] for _ in range(shards)]
    acc = 0
    for n in names:
        i = min(shards - 1, int(acc * shards / total)) if total else 0
        groups[i].append(n)
        acc += tensors[n].nbytes
    return [g for g in groups if g]


def write_weights(model: DemoModel, folder: Path) -> str:
    """Write the model's weights under `folder`; returns the catalog's weights path relative to it."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = random_state_dict(model)
    meta = {"format": "pt"}  # one key: safetensors writes metadata in hash order, more would vary run to run
    if model.shards <= 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata=meta)
        return "model.safetensors"
    groups = _split(list(tensors), tensors, model.shards)
    weight_map: dict[str, str] = {}
    for i, names in enumerate(groups, start=1):
        fname = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(folder / fname), metadata=meta)
        weight_map.update({n: fname for n in names})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return INDEX_NAME


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string for these values
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} to TOML")


def catalog_entry(model: DemoModel, weights: str) -> str:
    lines = ["[[models]]", f"id = {_toml_value(model.id)}", f"version = {_toml_value(model.version)}",
             f"weights = {_toml_value(weights)}",
             f"builder = {_toml_value('gpu_worker.demo_models:' + model.builder)}",
             f"builder_args = {_toml_value(model.args)}"]
    if model.description:
        lines.append(f"description = {_toml_value(model.description)}")
    if model.pinned:
        lines.append("pinned = true")
    if model.min_replicas:
        lines.append(f"min_replicas = {model.min_replicas}")
    for k, v in model.extra.items():
        lines.append(f"{k} = {_toml_value(v)}")
    for w in model.warmup:
        lines.append("[[models.warmup]]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in w.items())
    return "\n".join(lines) + "\n"


def checkpoint_entry(c: CheckpointDemo, path: str) -> str:
    lines = ["[[models]]", f"id = {_toml_value(c.id)}", f"version = {_toml_value(c.version)}",
             f"runtime = {_toml_value(c.runtime)}", f"path = {_toml_value(path)}",
             f"description = {_toml_value(c.description)}"]
    if c.runtime == "vllm" and any(a.base == c.id for a in ADAPTERS):
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in VLLM_LORA_FIELDS.items())
    for w in c.warmup:
        lines.append("[[models.warmup]]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in w.items())
    return "\n".join(lines) + "\n"


def adapter_entry(a: AdapterDemo, path: str) -> str:
    return "\n".join(["[[models]]", f"id = {_toml_value(a.id)}", f"version = {_toml_value(a.version)}",
                      'runtime = "vllm-adapter"', f"base = {_toml_value(a.base)}", f"path = {_toml_value(path)}",
                      f"rank = {a.rank}",
                      f"description = {_toml_value(f'random rank-{a.rank} LoRA adapter of {a.base}')}"]) + "\n"


def _spec_hash(models: list[DemoModel], checkpoints: list[CheckpointDemo] | None = None) -> str:
    text = json.dumps([[m.id, m.version, m.builder, m.args, m.warmup, m.shards, m.description] for m in models],
                      sort_keys=True)
    # The checkpoint demos count too: installing the vLLM engine later makes the next run add its model.
    ck = json.dumps([[c.id, c.version, c.runtime, c.seed, list(c.warmup), c.description]
                     for c in checkpoints or []], sort_keys=True)
    ck += json.dumps([[a.id, a.base, a.rank, a.seed] for a in _adapters_for(checkpoints or [])])
    ck += json.dumps(VLLM_LORA_FIELDS, sort_keys=True)
    return hashlib.sha256(("demo-v3" + text + ck).encode()).hexdigest()


def write_demo(out: Path | str, *, small: bool = False, force: bool = False,
               log: Callable[[str], None] | None = None, vllm: bool | None = None) -> Path:
    """Write the demo models and `catalog.toml` into `out`; returns the catalog path.

    `vllm`: whether to add the vllm demo model (default: whether the engine is installed here).
    A directory already holding this exact demo set (same spec, every weights file present) is left alone.
    """
    from prewarm.engines import engine_status

    out = Path(out)
    models = demo_set(small)
    if vllm is None:
        vllm = engine_status("vllm").available
    checkpoints = checkpoint_set(vllm)
    spec = _spec_hash(models, checkpoints)
    catalog = out / CATALOG_NAME
    stamp = out / _STAMP_NAME
    if not force and catalog.exists() and stamp.exists() and stamp.read_text().strip() == spec:
        return catalog
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)  # a run cut short leaves no stamp, so the next one rewrites
    entries = ["# prewarm demo catalog, written by `prewarm models demo`. Weights are seeded random.\n"]
    for m in models:
        t0 = time.perf_counter()
        rel = f"{m.id}-{m.version}"
        weights = write_weights(m, out / rel)
        entries.append(catalog_entry(m, f"{rel}/{weights}"))
        if log:
            size = sum(f.stat().st_size for f in (out / rel).glob("*.safetensors"))
            log(f"{m.id}@{m.version}: {size / 1e6:.1f} MB in {max(1, m.shards)} file(s), "
                f"{time.perf_counter() - t0:.1f} s")
    entries.extend(_write_checkpoints(out, checkpoints, log))
    if not vllm:
        entries.append(f"# {VLLM_MISSING}\n")
        if log:
            log(f"prewarm: {VLLM_MISSING}")
    tmp = catalog.with_suffix(".toml.tmp")
    tmp.write_text("\n".join(entries))
    tmp.replace(catalog)
    stamp.write_text(spec + "\n")
    return catalog


def _write_checkpoints(out: Path, checkpoints: list[CheckpointDemo],
                       log: Callable[[str], None] | None) -> list[str]:
    """Write each checkpoint demo's directory; returns their catalog entries."""
    import shutil

    from gpu_worker.demo_hf import tiny_llama_config, write_tiny_llama
    from gpu_worker.demo_lora import write_lora_adapter

    entries = []
    for c in checkpoints:
        t0 = time.perf_counter()
        rel = f"{c.id}-{c.version}"
        shutil.rmtree(out / rel, ignore_errors=True)  # no stale shard of an earlier layout left beside
        write_tiny_llama(out / rel, seed=c.seed)
        entries.append(checkpoint_entry(c, rel))
        if log:
            size = sum(f.stat().st_size for f in (out / rel).glob("*.safetensors"))
            log(f"{c.id}@{c.version} ({c.runtime}): {size / 1e6:.1f} MB checkpoint with tokenizer, "
                f"{time.perf_counter() - t0:.1f} s")
    for a in _adapters_for(checkpoints):
        rel = f"{a.id}-{a.version}"
        shutil.rmtree(out / rel, ignore_errors=True)
        write_lora_adapter(out / rel, tiny_llama_config(), rank=a.rank, seed=a.seed, base=a.base)
        entries.append(adapter_entry(a, rel))
        if log:
            size = (out / rel / "adapter_model.safetensors").stat().st_size
            log(f"{a.id}@{a.version} (vllm-adapter of {a.base}): rank {a.rank}, {size / 1e3:.0f} kB")
    return entries


def _adapters_for(checkpoints: list[CheckpointDemo]) -> list[AdapterDemo]:
    """The demo adapters whose base is among the checkpoints written."""
    written = {c.id for c in checkpoints}
    return [a for a in ADAPTERS if a.base in written]


def param_count(model: DemoModel) -> int:
    with torch.device("meta"):
        meta = BUILDERS[model.builder](**model.args)
    return sum(math.prod(t.shape) for t in meta.state_dict().values())
