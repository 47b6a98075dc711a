"""The memory a warmup input's passes need, counted against the device while it warms.

A replica's bytes are its module's storages (gpu_worker.device.module_bytes), committed once loaded. Its
warmup needs more, for a while: the input, and the activations of each pass. For each warmup input,
:class:`WarmupMemory`:

1. reserves the input's bytes (shape x dtype size) on the device before the input is made, so an input
   that does not fit the free budget is refused without allocating it (Device.reserve's rule and words);
2. runs the first pass under :class:`PassMeter`: the bytes of every storage the pass allocates, counted
   as module_bytes counts (distinct storages, views of one counted once, nothing made before the pass),
   live at once; past what the device has free, the pass is stopped there and the warmup refused. On
   CUDA the caching allocator's peak over the pass (torch.cuda.max_memory_allocated, from a reset) is
   taken when it is larger (kernels' workspaces are no tensors the meter sees);
3. reserves that peak too for the passes after (same shapes, same activations), and releases both once
   the input is done (or failed).

Every refusal is a WarmupDoesNotFit, raised before the worker holds more than the device has free. The runtime
then skips that input (`not_warmed`: its figures say why, the worker's ready event names it) and goes on: a
replica whose weights fit is not refused for its warmup, since every policy places by weights and a load
refused there would be planned again at the next tick, and again. Steady state is
unchanged: after warmup a replica holds its module (and a CUDA graph's pool), which is what it reports;
the warmup's peak is shown in its figures (`peak_bytes`), not kept in its bytes.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpu_worker.device import Device
from gpu_worker.errors import DoesNotFit, WarmupDoesNotFit
from prewarm.units import format_bytes

_ADVICE = ("the warmup's memory counts against the device: this input is not warmed (its first requests run "
           "cold); declare a smaller warmup input in the catalog, or give it a device with more free memory")


def not_warmed(figures: dict[str, Any], exc: WarmupDoesNotFit) -> dict[str, Any]:
    """An input's figures when it did not fit: no pass counted, and why (`not_warmed`)."""
    return {**figures, "passes": 0, "stable": False, "cut_short": False, "peak_bytes": 0, "not_warmed": str(exc)}


class OverBudget(Exception):
    """Raised inside a metered pass once its live bytes pass the limit (stops the pass there)."""

    def __init__(self, held: int, limit: int) -> None:
        super().__init__(f"{held} bytes live, past the limit of {limit}")
        self.held, self.limit = held, limit


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(address, bytes) of a tensor's storage; None for one without memory of its own (empty, exotic)."""
    try:
        st = t.untyped_storage()
        ptr = st.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return (ptr, st.nbytes()) if ptr else None


class PassMeter(TorchDispatchMode):
    """Counts the storages the ops run under it allocate, live at once (`held`, `peak`); raises OverBudget
    when `held` passes `limit`. Thread-local, as every dispatch mode: other threads' work is not counted."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._live: dict[int, list[int]] = {}  # storage address -> [bytes, live tensors over it]

    def _drop(self, ptr: int) -> None:
        entry = self._live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.held -= entry[0]
            del self._live[ptr]

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        before = {s[0] for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)
                  if (s := _storage(a)) is not None}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or (s := _storage(t)) is None:
                continue
            ptr, nbytes = s
            if ptr in self._live:
                self._live[ptr][1] += 1  # a view of (or in place on) a storage this pass made
            elif ptr in before:
                continue  # a view of something made before the pass: a weight, the input
            else:
                self._live[ptr] = [nbytes, 1]
                self.held += nbytes
                self.peak = max(self.peak, self.held)
            weakref.finalize(t, self._drop, ptr)
        if self.held > self.limit:
            raise OverBudget(self.held, self.limit)
        return out


def input_bytes(shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


class WarmupMemory:
    """One warmup input's memory on `device` (see the module docstring). `name` says which input, for
    the messages ("tiny-mlp@v1 warmup input #0 (shape [8, 64], float32)"). Without a device (a bench's
    runtime, no accounting) it only measures."""

    def __init__(self, device: Device | None, name: str, torch_device: torch.device | None = None) -> None:
        self.device = device
        self.torch_device = device.torch_device if device is not None else (torch_device or torch.device("cpu"))
        self.name = name
        self._key = f"{name} (warmup)"  # its own reservation: released by release(), not by the replica's
        self.input_bytes = 0
        self.pass_bytes = 0

    @property
    def peak_bytes(self) -> int:
        return self.input_bytes + self.pass_bytes

    def reserve_input(self, nbytes: int) -> None:
        self._reserve(nbytes, "its input would")
        self.input_bytes = nbytes

    def metered(self, one_pass: Callable[[], None]) -> Callable[[], None]:
        """`one_pass`, its first call measured against what is free and its peak then reserved."""
        first = [True]

        def run() -> None:
            if first[0]:
                first[0] = False
                self._first_pass(one_pass)
            else:
                one_pass()

        return run

    def _first_pass(self, one_pass: Callable[[], None]) -> None:
        dev = self.device
        limit = dev.inventory().free_bytes if dev is not None else 1 << 62
        base = _cuda_peak_start(self.torch_device)
        meter = PassMeter(limit)
        try:
            with meter:
                one_pass()
        except OverBudget as exc:
            assert dev is not None
            total = format_bytes(dev.inventory().total_bytes)
            raise WarmupDoesNotFit(f"{self.name}: its first pass's activations passed the {format_bytes(exc.limit)} "
                                   f"({exc.limit} bytes) GPU {dev.gpu_id} has free of {total} besides its input "
                                   f"({format_bytes(self.input_bytes)}), and the pass was stopped there; {_ADVICE}") \
                from None
        need = max(meter.peak, _cuda_peak_since(self.torch_device, base))
        self._reserve(need, "its passes' activations")
        self.pass_bytes = need

    def _reserve(self, nbytes: int, what: str) -> None:
        """Device.reserve's rule (atomic with every other load's), with a warmup's words when it refuses."""
        if self.device is None:
            return
        try:
            self.device.reserve(self._key, nbytes)
        except DoesNotFit:
            inv = self.device.inventory()
            besides = f" besides its input ({format_bytes(self.input_bytes)})" if self.input_bytes else ""
            raise WarmupDoesNotFit(f"{self.name}: {what} need {format_bytes(nbytes)} ({nbytes} bytes), but GPU "
                                   f"{self.device.gpu_id} has {format_bytes(inv.free_bytes)} ({inv.free_bytes} "
                                   f"bytes) free of {format_bytes(inv.total_bytes)}{besides}; {_ADVICE}") from None

    def release(self) -> None:
        if self.device is not None:
            self.device.release(self._key)


def _cuda_peak_start(dev: torch.device) -> int | None:
    """Start a CUDA peak window: the allocated bytes now (the peak reset to them); None on CPU."""
    if dev.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(dev)
    return torch.cuda.memory_allocated(dev)


def _cuda_peak_since(dev: torch.device, base: int | None) -> int:
    if base is None:
        return 0
    return max(0, torch.cuda.max_memory_allocated(dev) - base)
