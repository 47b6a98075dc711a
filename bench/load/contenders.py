"""What the benchmark times besides the loader and the raw read: safetensors.load_file, a memcpy into fresh
tensors, and device memory that exists before the load (the CPU analogue of a GPU's)."""

from __future__ import annotations

import ctypes
from pathlib import Path

from .files import MiB


def load_file_copy(path: Path) -> dict:
    """`safetensors.torch.load_file` + a copy into owned memory (the baseline the worker replaced)."""
    from safetensors.torch import load_file

    return {k: v.clone() for k, v in load_file(path).items()}


def fresh_memcpy(src, header, threads: int) -> dict:
    """The loader minus the file: allocate the model's tensors exactly as the loader does, then
    fill them from ``src`` (the same bytes, already in RAM) with ``threads`` threads of 8 MiB
    memmoves. Its throughput is the ceiling for any loader that must write every byte into new
    memory, which a raw read into one reused buffer never does."""
    from gpu_worker.loader import TORCH_DTYPES, _allocate

    device = src.device
    out = {name: _allocate(e.shape, TORCH_DTYPES[e.dtype], device) for name, e in header.tensors.items()}
    _memcpy_into(src, header, out, threads)
    return out


def _memcpy_into(src, header, out: dict, threads: int) -> None:
    import threading

    pieces: list[tuple[int, int, int]] = []
    base = src.data_ptr()
    step = 8 * MiB
    for name, e in header.tensors.items():
        d = out[name].data_ptr()
        for off in range(0, e.nbytes, step):
            pieces.append((d + off, base + e.begin + off, min(step, e.nbytes - off)))

    def part(i: int) -> None:  # ctypes calls release the GIL: the threads copy in parallel
        for dst, s, n in pieces[len(pieces) * i // threads : len(pieces) * (i + 1) // threads]:
            ctypes.memmove(dst, s, n)

    ts = [threading.Thread(target=part, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


class DeviceMemory:
    """A CPU stand-in for a GPU's memory, sized for one model: a :class:`gpu_worker.devmem.DeviceArena`
    (huge-page advised, faulted in once before the runs), whose blocks each run's tensors take and
    give back, as HBM exists before any load and the CUDA caching allocator hands out memory that is
    already mapped. ``allocate`` is the loader's allocator."""

    def __init__(self, header):
        from gpu_worker.devmem import DeviceArena

        self.header = header
        self.arena = DeviceArena(sum(-(-e.nbytes // 64) * 64 for e in header.tensors.values()))
        self.allocate = self.arena.allocate

    def huge_page_fraction(self) -> float | None:
        got = self.arena.huge_page_bytes()
        return None if got is None else got / self.arena.total_bytes

    def memcpy(self, src, threads: int) -> dict:
        """``fresh_memcpy`` into this memory: the ceiling of a load into already-mapped memory."""
        from gpu_worker.loader import TORCH_DTYPES

        out = {name: self.allocate(name, e.shape, TORCH_DTYPES[e.dtype]) for name, e in self.header.tensors.items()}
        _memcpy_into(src, self.header, out, threads)
        return out
