"""The torch path's building blocks: a catalog entry's module from its builder, sample inputs, summaries."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import torch

from gpu_worker.errors import (
    BadRequest,
    LoadFailed,
)
from prewarm.catalog import ModelEntry, WarmupInput

TORCH_INPUT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                      "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
MAX_INFER_ELEMENTS = 1 << 22


def _import_builder(path: str) -> Callable[..., torch.nn.Module]:
    module_name, _, func = path.partition(":")
    mod = importlib.import_module(module_name)
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise AttributeError(f"{module_name} has no function {func!r}")
    return fn


def _meta_module(entry: ModelEntry, doing: str) -> tuple[Callable[..., torch.nn.Module], torch.nn.Module]:
    """The entry's builder and its module built on the meta device (the shape: no memory, no random
    init), or a LoadFailed naming the builder and what went wrong."""
    try:
        builder = _import_builder(entry.builder)
        with torch.device("meta"):
            meta = builder(**entry.builder_args)
        if not isinstance(meta, torch.nn.Module):
            raise TypeError(f"returned {type(meta).__name__}, not a torch.nn.Module")
    except Exception as exc:  # noqa: BLE001
        raise LoadFailed(f"{doing} {entry.key}: builder {entry.builder}({_args(entry.builder_args)}) failed: "
                         f"{type(exc).__name__}: {exc}") from None
    return builder, meta

def make_input(spec: WarmupInput, device: torch.device, *, default_high: int = 2, seed: int = 0) -> torch.Tensor:
    """A deterministic sample input for a declared shape and dtype."""
    dtype = TORCH_INPUT_DTYPES[spec.dtype]
    gen = torch.Generator().manual_seed(seed)
    if spec.dtype in ("int64", "int32"):
        x = torch.randint(0, spec.high or default_high, spec.shape, generator=gen, dtype=dtype)
    elif spec.dtype == "bool":
        x = torch.randint(0, 2, spec.shape, generator=gen).bool()
    else:
        x = torch.randn(spec.shape, generator=gen).to(dtype)
    return x.to(device)


def summarize(y: Any) -> dict[str, Any]:
    """A small JSON-able summary of a module's output."""
    if isinstance(y, tuple | list):
        y = y[0]
    if isinstance(y, dict):
        y = next(iter(y.values()))
    if not isinstance(y, torch.Tensor):
        return {"type": type(y).__name__}
    f = y.detach().float()
    out: dict[str, Any] = {"shape": list(y.shape), "dtype": str(y.dtype).removeprefix("torch."),
                           "mean": float(f.mean()), "std": float(f.std()) if f.numel() > 1 else 0.0,
                           "min": float(f.min()), "max": float(f.max()),
                           "finite": bool(torch.isfinite(f).all())}
    if y.dim() >= 2:
        last = f.reshape(-1, f.shape[-1])[-1]
        out["top"] = [int(i) for i in torch.topk(last, k=min(5, last.numel())).indices]
    return out


def infer_input(entry: ModelEntry, inputs: Any, device: torch.device, module: torch.nn.Module | None,
                seed: int) -> torch.Tensor:
    base = entry.warmup[0]
    high = int(getattr(module, "vocab_size", 2) or 2)
    if inputs is None:
        return make_input(base, device, default_high=high, seed=seed)
    if isinstance(inputs, dict):
        shape = inputs.get("shape", list(base.shape))
        dtype = inputs.get("dtype", base.dtype)
        if not (isinstance(shape, list) and shape and all(isinstance(d, int) and d > 0 for d in shape)):
            raise BadRequest(f"inputs shape {shape!r} must be a list of positive integers")
        if dtype not in TORCH_INPUT_DTYPES:
            raise BadRequest(f"inputs dtype {dtype!r} is not one of {', '.join(TORCH_INPUT_DTYPES)}")
        if math.prod(shape) > MAX_INFER_ELEMENTS:
            raise BadRequest(f"inputs of shape {shape} exceed {MAX_INFER_ELEMENTS} elements")
        spec = WarmupInput(tuple(shape), dtype, inputs.get("high", base.high))
        return make_input(spec, device, default_high=high, seed=seed)
    if isinstance(inputs, list):
        try:
            x = torch.tensor(inputs, dtype=TORCH_INPUT_DTYPES[base.dtype])
        except (TypeError, ValueError, RuntimeError) as exc:
            raise BadRequest(f"inputs cannot be read as a {base.dtype} tensor: {exc}") from None
        if x.numel() > MAX_INFER_ELEMENTS:
            raise BadRequest(f"inputs exceed {MAX_INFER_ELEMENTS} elements")
        return x.to(device)
    raise BadRequest("inputs must be null, a {shape, dtype, high} table, or nested lists of numbers")



def _args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())
