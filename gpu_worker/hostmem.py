"""Host-memory advice for freshly allocated tensors (Linux; a no-op elsewhere).

A new destination tensor's pages are faulted in and zeroed by the kernel as the loader's reads
first touch them. With 4 KiB pages that is 262,144 faults per GiB, serialised on the process's
memory-map lock: on a 2-core machine it costs more than the copy itself (measured: ~2.5 GiB/s with
4 KiB pages vs ~7 GiB/s with 2 MiB pages for two reader threads). ``MADV_HUGEPAGE`` asks for
transparent huge pages on the tensor's interior so each fault maps 2 MiB. It is advice: the kernel
may ignore it (THP "never", fragmentation), and the result is still ordinary owned memory.
:func:`huge_page_bytes` says how much of a tensor the kernel did back with huge pages.

Even with 2 MiB faults, every byte of new memory is zeroed by the kernel before the loader writes it:
a load into fresh memory costs a page clear plus a copy, where a GPU load writes device memory that
already exists. :func:`prefault` faults a buffer in ahead of time (``MADV_POPULATE_WRITE``), which is
how ``prewarm bench load`` measures the loader against memory that, like a GPU's, is already mapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

__all__ = ["HUGE_PAGE_BYTES", "advise_hugepages", "huge_page_bytes", "prefault"]

HUGE_PAGE_BYTES = 2 << 20
_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_PAGE = 4096

_madvise = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _madvise = _libc.madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        _madvise = None


def advise_hugepages(t: torch.Tensor) -> bool:
    """Advise huge pages for the 2 MiB-aligned interior of a CPU tensor's memory, before first touch.

    Returns whether the advice was accepted; smaller tensors (no whole huge page inside) are left as
    they are."""
    if _madvise is None or t.device.type != "cpu":
        return False
    start = t.data_ptr()
    stop = start + t.numel() * t.element_size()
    lo = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    hi = stop // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if hi <= lo:
        return False
    return _madvise(lo, hi - lo, _MADV_HUGEPAGE) == 0


def prefault(t: torch.Tensor) -> bool:
    """Fault in every page of a *fresh* CPU tensor's memory, writable, before its first use.

    ``MADV_POPULATE_WRITE`` where the kernel has it (Linux >= 5.14; huge pages where advised, the
    contents of pages already present are kept); otherwise the tensor is written with zeros. Either
    way, treat the contents as unspecified afterwards. Returns whether madvise did it."""
    if t.device.type != "cpu" or t.numel() == 0:
        return False
    nbytes = t.numel() * t.element_size()
    if _madvise is not None:
        lo = t.data_ptr() // _PAGE * _PAGE
        hi = -(-(t.data_ptr() + nbytes) // _PAGE) * _PAGE
        if _madvise(lo, hi - lo, _MADV_POPULATE_WRITE) == 0:
            return True
    t.reshape(-1).view(torch.uint8).zero_()
    return False


def huge_page_bytes(t: torch.Tensor) -> int | None:
    """Bytes of a CPU tensor's range that the kernel backs with transparent huge pages, from
    ``/proc/self/smaps`` (per mapping: a mapping shared with other allocations, such as the heap,
    is counted up to the tensor's overlap with it, so that case is an upper bound). None where
    smaps cannot be read."""
    if t.device.type != "cpu":
        return None
    start = t.data_ptr()
    stop = start + t.numel() * t.element_size()
    total = 0
    overlap = 0
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    a, _, b = head.partition("-")
                    lo, hi = int(a, 16), int(b, 16)
                    overlap = max(0, min(hi, stop) - max(lo, start))
                elif head == "AnonHugePages:" and overlap:
                    total += min(overlap, int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        return None
    return total
