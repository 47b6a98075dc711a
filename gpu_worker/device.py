"""The device layer: where a worker's replicas live and how their memory is counted.

- `CpuDevice`: a CPU "virtual GPU" with a byte budget. Replicas are tensors in host memory that the worker
  owns (the loader reads into freshly allocated tensors, never views of a memory map), and the accounting
  is exact: the bytes of every storage a replica's module holds.
- `CudaDevice`: a real GPU. Totals come from `torch.cuda.mem_get_info` (capped by an optional budget); the
  free figure is the smaller of what the accounting leaves and what the driver reports free, so memory
  taken by other processes counts too. Eviction returns cached blocks with `torch.cuda.empty_cache()`.

Accounting is reservation-based: a preload reserves the bytes it will need *before* allocating (so two
concurrent preloads cannot both squeeze into the same free bytes), then commits the bytes it measured once
loaded. Every figure is bytes the worker counted itself, never guessed from names.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from dataclasses import dataclass

import torch

from gpu_worker.errors import DoesNotFit
from prewarm.config import DeviceSpec
from prewarm.units import format_bytes


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


def trim_host_memory() -> None:
    """Collect dropped tensors and hand freed heap pages back to the OS (glibc keeps them otherwise),
    so an evicted replica or unstaged model shows in the node's memory, not only in our count."""
    gc.collect()
    if _libc is not None:
        _libc.malloc_trim(0)


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of every distinct storage the module's parameters and buffers hold (shared storage counted once)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.device.type == "meta":
            continue
        st = t.untyped_storage()
        ident = (str(t.device), st.data_ptr())
        if ident in seen:
            continue
        seen.add(ident)
        total += st.nbytes()
    return total


@dataclass(frozen=True)
class Inventory:
    total_bytes: int
    used_bytes: int  # held by replicas (resident ones, and the reservations of loads in progress)
    free_bytes: int


class Device:
    """Common accounting; subclasses say what the hardware holds."""

    kind = "cpu"

    def __init__(self, spec: DeviceSpec, gpu_id: str) -> None:
        self.spec = spec
        self.gpu_id = gpu_id
        self._lock = threading.Lock()
        self._reserved: dict[str, int] = {}  # loads in progress
        self._owned: dict[str, int] = {}  # resident replicas: measured bytes

    @property
    def name(self) -> str:
        return self.spec.device

    @property
    def torch_device(self) -> torch.device:
        raise NotImplementedError

    def total_bytes(self) -> int:
        raise NotImplementedError

    def _hardware_free(self) -> int | None:
        return None

    def _accounted(self) -> int:
        return sum(self._reserved.values()) + sum(self._owned.values())

    def inventory(self) -> Inventory:
        with self._lock:
            total = self.total_bytes()
            used = self._accounted()
        free = max(0, total - used)
        hw = self._hardware_free()
        if hw is not None:
            free = min(free, hw)
        return Inventory(total, used, free)

    def reserve(self, key: str, nbytes: int, *, residents: list[str] | None = None) -> None:
        """Set `nbytes` aside for a load of `key`, or raise DoesNotFit saying why."""
        with self._lock:
            total = self.total_bytes()
            if nbytes > total:
                raise DoesNotFit(f"{key} needs {format_bytes(nbytes)} ({nbytes} bytes) but GPU {self.gpu_id} "
                                 f"holds only {format_bytes(total)} ({total} bytes) in all: it can never fit here")
            used = self._accounted()
            free = total - used
            hw = self._hardware_free()
            if hw is not None:
                free = min(free, hw)
            if nbytes > free:
                who = f"; resident or loading: {', '.join(residents)}" if residents else ""
                raise DoesNotFit(f"{key} needs {format_bytes(nbytes)} ({nbytes} bytes) but GPU {self.gpu_id} has "
                                 f"{format_bytes(free)} ({free} bytes) free of {format_bytes(total)}{who}; "
                                 "evict something first")
            self._reserved[key] = self._reserved.get(key, 0) + nbytes

    def commit(self, key: str, measured: int) -> None:
        """The load of `key` finished: it now owns `measured` bytes (replacing its reservation)."""
        with self._lock:
            self._reserved.pop(key, None)
            self._owned[key] = measured

    def commit_measured(self, key: str, measured: int) -> None:
        """Commit what a runtime measured it holds, or raise DoesNotFit when that exceeds what is left
        for `key` (its reservation or owned bytes plus the free budget): an engine's real footprint can
        be far above what it asked for. The caller then releases the replica."""
        with self._lock:
            total = self.total_bytes()
            room = total - (self._accounted() - self._reserved.get(key, 0) - self._owned.get(key, 0))
            if measured > room:
                raise DoesNotFit(f"{key} measured {format_bytes(measured)} ({measured} bytes) once loaded, but GPU "
                                 f"{self.gpu_id} has room for {format_bytes(room)} ({room} bytes) of {format_bytes(total)}; "
                                 "it was released: give it a device with more memory, or evict something first")
            self._reserved.pop(key, None)
            self._owned[key] = measured

    def remeasured(self, key: str, measured: int) -> bool:
        """A resident's new measurement (an engine's footprint now): its owned bytes become `measured`, even
        past the budget, since that is what it holds; returns whether they still fit the device."""
        with self._lock:
            if key not in self._owned:
                return True  # released meanwhile: nothing to correct
            self._owned[key] = measured
            return self._accounted() <= self.total_bytes()

    def release(self, key: str) -> int:
        """Forget `key`'s reservation and owned bytes; returns the owned bytes freed (0 if none)."""
        with self._lock:
            self._reserved.pop(key, None)
            freed = self._owned.pop(key, 0)
        return freed

    def reclaim(self) -> None:
        """Return memory the dropped references held (the CPU frees on the last reference)."""
        gc.collect()

    def synchronize(self) -> None:
        """Wait for queued device work (for honest latency figures)."""


class CpuDevice(Device):
    kind = "cpu"

    def __init__(self, spec: DeviceSpec, gpu_id: str) -> None:
        super().__init__(spec, gpu_id)
        if spec.budget_bytes is None:
            raise ValueError(f"CPU virtual GPU {spec.device} needs a memory budget, e.g. {spec.device}=4GiB")

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def reclaim(self) -> None:
        # Tensors under glibc's mmap threshold live in the heap: freed, but kept by the process unless trimmed.
        trim_host_memory()

    def total_bytes(self) -> int:
        assert self.spec.budget_bytes is not None
        return self.spec.budget_bytes


class CudaDevice(Device):
    kind = "cuda"

    def __init__(self, spec: DeviceSpec, gpu_id: str) -> None:
        super().__init__(spec, gpu_id)
        if not torch.cuda.is_available():
            raise RuntimeError(f"{spec.device}: CUDA is not available on this machine")
        self._dev = torch.device(spec.device)
        if self._dev.index is None or self._dev.index >= torch.cuda.device_count():
            raise RuntimeError(f"{spec.device}: no such CUDA device (this machine has "
                               f"{torch.cuda.device_count()})")
        _, hw_total = torch.cuda.mem_get_info(self._dev)
        self._total = min(hw_total, spec.budget_bytes) if spec.budget_bytes else hw_total

    @property
    def torch_device(self) -> torch.device:
        return self._dev

    def total_bytes(self) -> int:
        return self._total

    def _hardware_free(self) -> int | None:
        free, _ = torch.cuda.mem_get_info(self._dev)
        # Our own cached-but-unused blocks are free to us even though the driver counts them as taken.
        cached = torch.cuda.memory_reserved(self._dev) - torch.cuda.memory_allocated(self._dev)
        return free + max(0, cached)

    def allocated_bytes(self) -> int:
        return torch.cuda.memory_allocated(self._dev)

    def reclaim(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self._dev)


def make_device(spec: DeviceSpec, gpu_id: str) -> Device:
    return CudaDevice(spec, gpu_id) if spec.is_cuda else CpuDevice(spec, gpu_id)
