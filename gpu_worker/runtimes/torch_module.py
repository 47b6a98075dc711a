"""The `torch` runtime: a module built by a catalog entry's builder, filled by prewarm's streaming loader.

Today's torch path expressed as a Runtime (gpu_worker/runtimes/__init__.py), with no behaviour change:
required_bytes builds the module on the meta device and sums the weight headers' data bytes (or a staged
copy's, when the node's host cache holds one that matches: then `source` is "host"); load reads the
weights (promoted from the host cache, or streamed from storage into the CPU arena where there is one)
and assigns them into the module; warm runs every declared input shape until its latency is stable;
serve is one forward pass summarised; release drops the module (the worker hands the bytes back).
With the catalog's `cuda_graphs = true` on a CUDA device, warmup also captures a CUDA graph per declared
input and serve replays it for inputs of that shape (runtimes/cuda_graphs.py); on CPU the flag is noted
in the warmup figures and the log, and ignored.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from gpu_worker.device import Device, module_bytes
from gpu_worker.devmem import DeviceArena
from gpu_worker.errors import BadRequest, Cancelled, LoadFailed, NotResident, WarmupDoesNotFit, WarmupFailed
from gpu_worker.host_cache import HostCache
from gpu_worker.runtimes import CheckCancel, Progress
from gpu_worker.runtimes.cuda_graphs import GraphSet, plan
from gpu_worker.runtimes.warmup import WarmupPolicy, run_until_stable
from gpu_worker.runtimes.warmup_memory import OverBudget, WarmupMemory, input_bytes, not_warmed
from prewarm.catalog_bounds import MAX_INPUT_ELEMENTS, check_input_shape
from prewarm.catalog_entries import ModelEntry, WarmupInput
from prewarm.safetensors_header import SafetensorsError, read_header, weight_files

log = logging.getLogger("prewarm.worker")
Expected = dict[str, tuple[torch.dtype, tuple[int, ...]]]

TORCH_INPUT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                      "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
MAX_INFER_ELEMENTS = MAX_INPUT_ELEMENTS  # the catalog's bound on a warmup input: one rule for both


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
        if (too_big := check_input_shape(shape)) is not None:
            raise BadRequest(f"inputs shape {shape} {too_big}")
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


class TorchRuntime:
    """One torch module replica on one device; see the module docstring."""

    name = "torch"
    remeasure_seconds: float | None = None  # in the worker's process: its bytes change only by load
    endpoint: str | None = None

    def __init__(self, entry: ModelEntry, device: Device, gpu: str, *, policy: WarmupPolicy,
                 host_cache: HostCache | None = None, staged_bytes: Callable[[ModelEntry, Expected], int | None] | None = None,
                 arena: DeviceArena | None = None, threads: int | None = None) -> None:
        self.entry = entry
        self.device = device
        self.gpu = gpu
        self.policy = policy
        self.host_cache = host_cache
        self._staged_bytes = staged_bytes
        self.arena = arena
        self.threads = threads
        self.source = "storage"  # "host" when promoted from the node's host cache
        self.module: torch.nn.Module | None = None
        self._builder: Callable[..., torch.nn.Module] | None = None
        self._expected: Expected = {}
        self._extra: list[str] = []
        self.graphs: GraphSet | None = None  # CUDA graphs captured at warmup (catalog cuda_graphs, CUDA only)
        self.graph_note: str | None = None  # why cuda_graphs = true is not used here, when it is not
        self.graph_bytes = 0  # device memory the captured graphs hold (their pool), counted in measure()

    def required_bytes(self) -> int:
        from gpu_worker.loader import expected_from_module

        key = self.entry.key
        # The module's shape, on the meta device: no memory, no random init.
        self._builder, meta = _meta_module(self.entry, "building")
        self._expected = expected_from_module(meta)
        # Buffers outside the state dict are made by the builder, not read from the weights.
        self._extra = [n for n, _ in meta.named_buffers() if n not in self._expected]
        del meta
        # A model staged in this node's host cache is promoted from there (its bytes are known, no storage
        # I/O); otherwise the headers say exactly how much (read now, so a file changed since is measured).
        staged = self._staged_bytes(self.entry, self._expected) if self._staged_bytes else None
        if staged is not None:
            self.source = "host"
            return staged
        try:
            roots = self.entry.roots  # each file checked against them as it is opened
            return sum(read_header(f, roots).data_bytes for f in weight_files(self.entry.weights, roots))
        except SafetensorsError as exc:
            raise LoadFailed(f"loading {key} onto {self.gpu}: {exc}") from None

    def load(self, progress: Progress | None = None, check_cancel: CheckCancel | None = None) -> int:
        from gpu_worker.loader import LoadError, load_weights

        if self._builder is None:
            self.required_bytes()
        assert self._builder is not None
        entry, key, dev = self.entry, self.entry.key, self.device
        tensors: dict[str, torch.Tensor] | None = None
        if self.source == "host" and self.host_cache is not None:
            try:
                tensors = self.host_cache.promote(key, dev.torch_device, progress=progress)
            except KeyError:
                # Unstaged between our look and the copy: read it from storage after all.
                log.info("%s left the host cache before its promotion to %s; loading from storage", key, self.gpu)
                self.source = "storage"
        try:
            if tensors is None:
                tensors = load_weights(entry.weights, dev.torch_device, progress=progress, expected=self._expected,
                                       threads=self.threads, roots=entry.roots,
                                       allocator=self.arena.allocate if self.arena is not None else None)
        except Cancelled:
            raise
        except (SafetensorsError, LoadError, OSError) as exc:
            raise LoadFailed(f"loading {key} onto {self.gpu}: {exc}") from None
        try:
            if self._extra:
                # The module has buffers the weights do not carry: build it for real on the device.
                with dev.torch_device:
                    module = self._builder(**entry.builder_args)
            else:
                with torch.device("meta"):
                    module = self._builder(**entry.builder_args)
            module.load_state_dict(tensors, strict=True, assign=True)
        except Exception as exc:  # noqa: BLE001
            tensors.clear()
            raise LoadFailed(f"building {key} from {entry.weights}: {type(exc).__name__}: {exc}") from None
        tensors.clear()
        still_meta = [n for n, t in list(module.named_parameters()) + list(module.named_buffers())
                      if t.device.type == "meta"]
        if still_meta:
            raise LoadFailed(f"building {key}: {len(still_meta)} tensor(s) of the module have no weights, "
                             f"e.g. {still_meta[0]!r}; check the builder against {entry.weights}")
        module.eval()
        module.requires_grad_(False)
        self.module = module
        return module_bytes(module)

    def warm(self, check_cancel: CheckCancel | None = None) -> list[dict[str, Any]]:
        """Run every declared input until its latency is stable (bounded); returns per-input figures."""
        module = self.module
        assert module is not None
        out = []
        high = int(getattr(module, "vocab_size", 2) or 2)
        capture, self.graph_note = plan(self.entry.cuda_graphs, self.device.torch_device)
        if self.graph_note:
            log.info("%s on %s: %s", self.entry.key, self.gpu, self.graph_note)
        self.graphs = GraphSet(module) if capture else None
        for i, spec in enumerate(self.entry.warmup):
            assert isinstance(spec, WarmupInput)
            where = f"warmup input #{i} (shape {list(spec.shape)}, {spec.dtype})"
            # Its input and activations count against the device while it warms (not warmed if they do not fit).
            memory = WarmupMemory(self.device, f"{self.entry.key} on {self.gpu}: {where}")
            try:
                memory.reserve_input(input_bytes(spec.shape, TORCH_INPUT_DTYPES[spec.dtype]))
                out.append(self._warm_one(module, spec, i, where, high, memory, check_cancel))
            except WarmupDoesNotFit as exc:
                log.warning("%s", exc)
                out.append(not_warmed({"shape": list(spec.shape), "dtype": spec.dtype}, exc))
            finally:
                memory.release()
        return out

    def _warm_one(self, module: torch.nn.Module, spec: WarmupInput, i: int, where: str, high: int,
                  memory: WarmupMemory, check_cancel: CheckCancel | None) -> dict[str, Any]:
        try:
            x = make_input(spec, self.device.torch_device, default_high=high, seed=i)
        except Exception as exc:  # noqa: BLE001
            raise WarmupFailed(f"{self.entry.key} on {self.gpu}: {where}: cannot make the input: {exc}") from None

        def one() -> None:
            try:
                with torch.inference_mode():
                    module(x)
                self.device.synchronize()
            except OverBudget:
                raise  # the memory meter stopped the pass: WarmupMemory says why
            except Exception as exc:  # noqa: BLE001
                raise WarmupFailed(f"{self.entry.key} on {self.gpu}: {where} failed: {type(exc).__name__}: "
                                   f"{exc}") from None

        fig = run_until_stable(memory.metered(one), self.policy, check_cancel)
        return {"shape": list(spec.shape), "dtype": spec.dtype, **fig, "peak_bytes": memory.peak_bytes,
                **self._graph(x, where, check_cancel)}

    def _graph(self, x: torch.Tensor, where: str, check_cancel: CheckCancel | None) -> dict[str, Any]:
        """Capture this warmup input's CUDA graph (the eager passes before were its warm-up) and run the
        replay until stable; the figures say whether it is used, or why not."""
        if self.graphs is None:
            return {"cuda_graph": False, "cuda_graph_note": self.graph_note} if self.graph_note else {}
        dev = self.device.torch_device
        before = torch.cuda.memory_reserved(dev)  # the graph pool's segments stay with the graph
        why = self.graphs.capture(x)
        self.graph_bytes += max(0, torch.cuda.memory_reserved(dev) - before)
        if why is not None:
            log.warning("%s on %s: %s: CUDA graph capture failed, eager for this shape: %s", self.entry.key,
                        self.gpu, where, why)
            return {"cuda_graph": False, "cuda_graph_note": f"capture failed: {why}"}
        graphs = self.graphs

        def replay() -> None:
            graphs.run(x, self._eager)
            self.device.synchronize()

        fig = run_until_stable(replay, self.policy, check_cancel)
        return {"cuda_graph": True, "graph_latency_ms": fig["latency_ms"], "graph_passes": fig["passes"]}

    def _eager(self, x: torch.Tensor) -> Any:
        module = self.module
        if module is None:
            raise NotResident(f"{self.entry.key} on {self.gpu} is no longer loaded")
        with torch.inference_mode():
            return module(x)

    def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        """One forward pass: request {"inputs": None | {shape, dtype, high} | nested lists, "seed": n}."""
        module = self.module  # an evict meanwhile drops the runtime's reference, not this one
        if module is None:
            raise NotResident(f"{self.entry.key} on {self.gpu} is no longer loaded")
        x = infer_input(self.entry, request.get("inputs"), self.device.torch_device, module,
                        int(request.get("seed", 0)))
        graphs = self.graphs
        t0 = time.perf_counter()
        with torch.inference_mode():
            if graphs is not None:  # a captured shape is replayed, any other runs eagerly
                y, replayed = graphs.run(x, module)
            else:
                y, replayed = module(x), False
        self.device.synchronize()
        latency = time.perf_counter() - t0
        out = {"latency_ms": round(latency * 1000, 3), "latency_seconds": latency,
               "input": {"shape": list(x.shape), "dtype": str(x.dtype)[6:]}, "output": summarize(y)}
        if self.entry.cuda_graphs:
            out["cuda_graph"] = replayed
        return out

    def measure(self) -> int:
        return module_bytes(self.module) + self.graph_bytes if self.module is not None else 0

    def died(self) -> str | None:
        return None  # in the worker's own process: it lives as long as the worker

    def release(self) -> int:
        freed = self.measure()
        if self.graphs is not None:
            self.graphs.release()
        self.module, self.graphs, self.graph_bytes = None, None, 0  # running infers keep their own references
        return freed
