"""CUDA graphs for the `torch` runtime (catalog `cuda_graphs = true`, issue 13 item 7).

On a CUDA device, warmup captures one torch.cuda.CUDAGraph per declared warmup input (shape and dtype),
with static input and output buffers; a request whose input has a captured shape and dtype is copied into
that graph's input buffer and replayed (one launch instead of one per kernel), any other runs eagerly. On
CPU the flag is accepted and ignored: `plan` says so, and the runtime puts that note in its warmup
figures and log. Everything up to the CUDA calls is the same code on both (plan, key, the eager
fallback), so CPU tests exercise it.

A graph's buffers are shared by every request of its shape: a replay holds the graph's lock from the copy
in to the copy of the output out, so concurrent requests never see each other's outputs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

CAPTURE_WARM_PASSES = 3  # eager passes on a side stream before capture, as torch's docs ask
GraphKey = tuple[tuple[int, ...], torch.dtype]


def plan(requested: bool, device: torch.device, cuda_available: bool | None = None) -> tuple[bool, str | None]:
    """Whether to capture graphs, and a note when the catalog asked for them but they are not used here."""
    if not requested:
        return False, None
    if device.type != "cuda":
        return False, (f"cuda_graphs = true is ignored on {device.type} device {device}: CUDA graphs need a CUDA "
                       "device; warmup and requests run eagerly")
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not available:
        return False, f"cuda_graphs = true is ignored: CUDA is not available to this process ({device})"
    return True, None


def key(x: torch.Tensor) -> GraphKey:
    return tuple(x.shape), x.dtype


def _clone(y: Any) -> Any:
    """The output copied out of a graph's static buffers (tensors in tuples, lists and dicts)."""
    if isinstance(y, torch.Tensor):
        return y.clone()
    if isinstance(y, tuple | list):
        return type(y)(_clone(v) for v in y)
    if isinstance(y, dict):
        return {k: _clone(v) for k, v in y.items()}
    return y


@dataclass
class Captured:
    graph: Any  # torch.cuda.CUDAGraph
    static_in: torch.Tensor
    static_out: Any
    lock: threading.Lock = field(default_factory=threading.Lock)


class GraphSet:
    """The captured graphs of one replica's module, by input shape and dtype."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.graphs: dict[GraphKey, Captured] = {}
        self.failed: dict[GraphKey, str] = {}  # shapes whose capture failed (they run eagerly), and why

    def capture(self, x: torch.Tensor) -> str | None:
        """Capture the module on an input like `x`; returns None, or why it could not (then eager)."""
        k = key(x)
        if k in self.graphs:
            return None
        try:
            static_in = x.clone()
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.inference_mode(), torch.cuda.stream(side):
                for _ in range(CAPTURE_WARM_PASSES):
                    self.module(static_in)
            torch.cuda.current_stream(x.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph):
                static_out = self.module(static_in)
            torch.cuda.synchronize(x.device)
        except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: this shape runs eagerly
            why = f"{type(exc).__name__}: {exc}"
            self.failed[k] = why
            return why
        self.graphs[k] = Captured(graph, static_in, static_out)
        return None

    def run(self, x: torch.Tensor, eager: Callable[[torch.Tensor], Any]) -> tuple[Any, bool]:
        """The module's output for `x`: replayed when a graph of its shape exists, else `eager(x)`;
        returns (output, replayed)."""
        c = self.graphs.get(key(x))
        if c is None:
            return eager(x), False
        with c.lock:
            c.static_in.copy_(x)
            c.graph.replay()
            return _clone(c.static_out), True

    def release(self) -> None:
        self.graphs.clear()  # the graphs' private memory pool goes with its last graph
