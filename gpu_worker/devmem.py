"""Device memory for a CPU virtual GPU: one pre-faulted, huge-page-backed arena that tensors are carved from.

A GPU's memory exists before any load: the CUDA caching allocator hands out blocks that are already
mapped, so a load only writes bytes. A CPU tensor from ``torch.empty`` is new memory: the kernel faults
in and zeroes each page as the loader first writes it, which costs about as much as the copy itself
(see ``prewarm bench load``: ``loader`` against ``loader_prefaulted``). :class:`DeviceArena` is the CPU
analogue of a GPU's memory: one buffer of a fixed size, advised huge pages and faulted in once, from which
:meth:`DeviceArena.allocate` (the loader's ``allocator``) carves tensors.

Each carved tensor has a storage of its own, of exactly its bytes (so counting a module's storages, as
the worker's accounting does, gives the same figure as for ``torch.empty`` tensors), over the arena's
memory. Its block returns to the arena when the last reference to that storage goes (a finalizer), never
earlier: an evicted model's bytes come back once nothing (a running inference, say) holds its tensors.
The arena's pages themselves are never handed back to the OS while the arena lives, as a GPU keeps its
memory. When no free block is large enough (fragmentation), ``allocate`` falls back to ``torch.empty``:
correct, only slower. API::

    arena = DeviceArena(nbytes, *, prefault_pages=True)
    arena.allocate(name, shape, dtype) -> torch.Tensor     # a contiguous CPU tensor (contents unspecified)
    arena.total_bytes, arena.used_bytes, arena.free_bytes, arena.largest_free_block
    arena.carved, arena.fallbacks                          # counts, for tests and reports
    arena.huge_page_bytes() -> int | None                  # how much of it is 2 MiB pages
    arena.contains(t) -> bool                              # is t's memory inside the arena
"""

from __future__ import annotations

import bisect
import ctypes
import math
import threading
import weakref

import torch

from gpu_worker.hostmem import HUGE_PAGE_BYTES, advise_hugepages, huge_page_bytes, prefault

__all__ = ["DeviceArena"]

_ALIGN = 64


class DeviceArena:
    """A fixed pool of pre-faulted host memory with a first-fit block allocator (see the module docstring)."""

    def __init__(self, nbytes: int, *, prefault_pages: bool = True):
        if nbytes <= 0:
            raise ValueError("a device arena needs a positive size")
        # 2 MiB of slack so the usable range can start on a huge-page boundary (every page of it is then
        # advised, not only the interior of an arbitrarily placed buffer).
        self._buffer = torch.empty(nbytes + HUGE_PAGE_BYTES, dtype=torch.uint8)
        self._base = -(-self._buffer.data_ptr() // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
        skip = self._base - self._buffer.data_ptr()
        self._usable = self._buffer[skip : skip + nbytes]
        advise_hugepages(self._usable)
        if prefault_pages:
            prefault(self._usable)
        self.total_bytes = nbytes
        self._lock = threading.RLock()  # a finalizer may run inside allocate (garbage collection)
        # Free blocks as two parallel sorted lists of offsets and sizes.
        self._free_off: list[int] = [0]
        self._free_len: list[int] = [nbytes]
        self.used_bytes = 0
        self.carved = 0
        self.fallbacks = 0

    # -- figures ---------------------------------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    @property
    def largest_free_block(self) -> int:
        with self._lock:
            return max(self._free_len, default=0)

    def huge_page_bytes(self) -> int | None:
        """How much of the arena the kernel backs with 2 MiB pages (None where it cannot tell)."""
        return huge_page_bytes(self._usable)

    def contains(self, t: torch.Tensor) -> bool:
        p = t.data_ptr()
        return t.device.type == "cpu" and self._base <= p < self._base + self.total_bytes

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous tensor of ``shape``/``dtype`` carved from the arena (``torch.empty`` when no
        block fits). The loader's ``allocator``; ``name`` is not used."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        size = -(-nbytes // _ALIGN) * _ALIGN
        off = self._take(size)
        if off is None:
            with self._lock:
                self.fallbacks += 1
            return torch.empty(shape, dtype=dtype)
        # A buffer object of its own over the block: the tensor's storage holds it (and nothing else of
        # the arena), and the block goes back when that storage is freed.
        holder = (ctypes.c_char * nbytes).from_address(self._base + off)
        weakref.finalize(holder, self._give_back, off, size, self._buffer).atexit = False
        t = torch.frombuffer(holder, dtype=torch.uint8)
        return t.view(dtype).reshape(shape)

    def _take(self, size: int) -> int | None:
        with self._lock:
            for i, n in enumerate(self._free_len):
                if n >= size:
                    off = self._free_off[i]
                    if n == size:
                        del self._free_off[i], self._free_len[i]
                    else:
                        self._free_off[i] += size
                        self._free_len[i] -= size
                    self.used_bytes += size
                    self.carved += 1
                    return off
        return None

    def _give_back(self, off: int, size: int, _buffer: torch.Tensor) -> None:
        # ``_buffer`` is bound into the finalizer: the arena's memory outlives every tensor carved from it,
        # even one that outlives the arena object itself.
        with self._lock:
            i = bisect.bisect_left(self._free_off, off)
            self._free_off.insert(i, off)
            self._free_len.insert(i, size)
            # Coalesce with the next block, then with the previous one.
            if i + 1 < len(self._free_off) and off + self._free_len[i] == self._free_off[i + 1]:
                self._free_len[i] += self._free_len.pop(i + 1)
                self._free_off.pop(i + 1)
            if i > 0 and self._free_off[i - 1] + self._free_len[i - 1] == off:
                self._free_len[i - 1] += self._free_len.pop(i)
                self._free_off.pop(i)
            self.used_bytes -= size
