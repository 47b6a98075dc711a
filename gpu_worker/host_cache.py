"""The node's host-memory cache (the staging tier): whole models' tensors in host memory.

The loader's per-thread ring of read buffers is another thing (gpu_worker/read_ring.py): "staging" here
means only this tier.

:class:`HostCache` — the node-level *staging tier* of issue 4: a budgeted cache of whole models'
   tensors in host memory (pinned where CUDA exists). Each staged model lives in one
   :class:`HostArena` (one allocation, 64-byte aligned tensor views, ``cudaHostRegister``-pinned on
   CUDA, unpinned and freed on eviction); its ``nbytes`` (what the budget counts) is the arena's
   size: the data plus at most 63 bytes of padding per tensor. API::

       cache = HostCache(budget_bytes=None, *, pin=None, value_fn=None)
           # budget None: $PREWARM_HOST_CACHE (e.g. "16GiB"), else a quarter of physical RAM.
           # pin None: pin when torch.cuda.is_available().
           # value_fn(entry) -> float: the value of keeping a staged entry (default: entry.value,
           #   as given to stage()/set_value()); eviction compares value per byte.
       cache.stage(key, source, *, value=0.0, progress=None, threads=None, expected=None,
                   roots=None) -> StagedModel   # roots: the model roots each file must lie in
           # read the weights (a .safetensors file, an index json, a directory, or a list of shard
           # paths) into host memory; idempotent per key. Makes room by evicting entries whose value
           # per byte is below the new one's; raises HostCacheFull when it cannot.
       cache.promote(key, device, *, progress=None) -> dict[str, torch.Tensor]
           # copy a staged model to a device (owned tensors; the cache keeps its copy). No storage I/O.
           # KeyError when the key is not staged.
       cache.evict(key) -> int                      # bytes freed (0 when absent); idempotent
       cache.set_value(key, value) -> None          # update the keep-value used by eviction
       cache.plan_eviction(nbytes, value) -> list[str]   # pure: which keys stage() would evict
       cache.get(key) -> StagedModel | None; key in cache; len(cache); cache.entries() -> list[StagedModel]
           # StagedModel: key, tensors, nbytes, pinned, value, staged_at, stage_seconds,
           #   last_promoted_at, promotions. Its tensors are the cache's: read them, do not keep them
           #   past an eviction (they stay valid memory, but unpinned and uncounted).
       cache.used_bytes, cache.free_bytes, cache.budget_bytes, cache.pinned
       copy_tensors(tensors, device, *, progress=None) -> dict[str, torch.Tensor]   # promote's copy

   Entries that are being promoted are never evicted under a running promotion. The cache is
   thread-safe; loads for different keys run concurrently, one key loads once.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpu_worker.hostmem import HUGE_PAGE_BYTES, advise_hugepages
from prewarm.units import parse_bytes

__all__ = [
    "HostArena",
    "HostCache",
    "HostCacheFull",
    "StagedModel",
    "copy_tensors",
    "default_host_cache_bytes",
]

Progress = Callable[[int, int], None]


# --------------------------------------------------------------------------------------------------
# Host-memory staging tier


def _host_register(ptr: int, nbytes: int) -> bool:
    """Page-lock existing host memory for DMA (as torch's own checkpoint stager does)."""
    try:
        return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 1)) == 0  # 1: cudaHostRegisterPortable
    except Exception:  # noqa: BLE001 - no CUDA runtime: stay unpinned, still correct
        return False


def _host_unregister(ptr: int) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:  # noqa: BLE001 - nothing to undo without a runtime
        pass


class HostArena:
    """One host allocation holding all of a staged model's tensors (64-byte aligned views).

    Why not ``pin_memory=True`` per tensor: torch's caching pinned allocator rounds every block up
    to a power of two and keeps freed blocks, so a budgeted cache would hold up to twice its
    bytes and never give them back. Here the arena is ordinary memory (huge-page advised) of
    exactly the model's size, page-locked once with ``cudaHostRegister`` where CUDA exists, and
    unregistered on :meth:`release` (or, failing that, when the buffer is garbage collected).
    """

    ALIGN = 64

    def __init__(self, sizes: dict[str, int], *, pin: bool):
        self.offsets: dict[str, int] = {}
        off = 0
        for name, n in sizes.items():
            self.offsets[name] = off
            off += -(-n // self.ALIGN) * self.ALIGN
        self.nbytes = off
        self.buffer: torch.Tensor | None = torch.empty(off, dtype=torch.uint8)
        if off >= 2 * HUGE_PAGE_BYTES:
            advise_hugepages(self.buffer)
        self.pinned = bool(pin and off and _host_register(self.buffer.data_ptr(), off))
        self._finalizer = (
            weakref.finalize(self.buffer, _host_unregister, self.buffer.data_ptr()) if self.pinned else None
        )

    def allocate(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The loader's allocator: a view of the arena for tensor ``name``."""
        if self.buffer is None:
            raise RuntimeError("arena already released")
        off = self.offsets[name]
        n = math.prod(shape) * dtype.itemsize
        return self.buffer[off : off + n].view(dtype).reshape(shape)

    def release(self) -> None:
        """Unpin now and drop the arena's own reference (views still held keep plain memory)."""
        if self._finalizer is not None:
            self._finalizer()  # runs _host_unregister once
        self.buffer = None


class HostCacheFull(RuntimeError):
    """A model cannot be staged: it is bigger than the budget, or room would need more valuable bytes."""


@dataclass
class StagedModel:
    key: str
    tensors: dict[str, torch.Tensor]
    nbytes: int
    pinned: bool
    value: float = 0.0
    staged_at: float = field(default_factory=time.time)
    stage_seconds: float = 0.0
    last_promoted_at: float | None = None
    promotions: int = 0
    arena: HostArena | None = None
    _users: int = 0  # running promotions; an entry in use is never evicted
    _evicted: bool = False

    @property
    def value_per_byte(self) -> float:
        return self.value / max(self.nbytes, 1)


def default_host_cache_bytes(text: str | None = None) -> int:
    """The host cache budget that PREWARM_HOST_CACHE's `text` asks for (a size such as 16GiB, or a
    percentage of RAM such as 25%); None or blank: a quarter of physical memory."""
    text = (text or "").strip()
    total = _physical_memory()
    if not text:
        return total // 4
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise ValueError(f"PREWARM_HOST_CACHE={text!r}: write a size (16GiB) or a percentage (25%)") from None
        return int(total * pct / 100)
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise ValueError(f"PREWARM_HOST_CACHE: {exc}") from None


def _physical_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - psutil missing or unsupported: fall back to sysconf
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class HostCache:
    """A budgeted, thread-safe cache of models' tensors in host memory (see the module docstring)."""

    def __init__(
        self,
        budget_bytes: int | None = None,
        *,
        pin: bool | None = None,
        value_fn: Callable[[StagedModel], float] | None = None,
    ):
        self.budget_bytes = default_host_cache_bytes() if budget_bytes is None else int(budget_bytes)
        if self.budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self.pinned = torch.cuda.is_available() if pin is None else bool(pin)
        self.value_fn = value_fn or (lambda e: e.value)
        self._lock = threading.Condition()
        self._entries: dict[str, StagedModel] = {}
        self._reserved: dict[str, int] = {}  # keys being staged -> bytes held for them
        self._loading: set[str] = set()

    # -- accounting ------------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values()) + sum(self._reserved.values())

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.used_bytes

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: str) -> StagedModel | None:
        with self._lock:
            return self._entries.get(key)

    def entries(self) -> list[StagedModel]:
        with self._lock:
            return list(self._entries.values())

    def set_value(self, key: str, value: float) -> None:
        with self._lock:
            if key in self._entries:
                self._entries[key].value = float(value)

    # -- eviction --------------------------------------------------------------------------------
    def plan_eviction(self, nbytes: int, value: float = 0.0) -> list[str]:
        """Keys to evict so that ``nbytes`` fit, cheapest value per byte first; only entries whose
        value per byte is below the newcomer's (``value / nbytes``) and not in use are candidates.
        Raises HostCacheFull when even evicting every candidate leaves too little room."""
        with self._lock:
            return self._plan_locked(nbytes, value)

    def _plan_locked(self, nbytes: int, value: float) -> list[str]:
        if nbytes > self.budget_bytes:
            raise HostCacheFull(
                f"model needs {nbytes} bytes but the host cache budget is {self.budget_bytes} "
                "(raise PREWARM_HOST_CACHE)"
            )
        free = self.budget_bytes - sum(e.nbytes for e in self._entries.values()) - sum(self._reserved.values())
        if free >= nbytes:
            return []
        newcomer = value / max(nbytes, 1)
        candidates = sorted(
            (
                (self.value_fn(e) / max(e.nbytes, 1), e.staged_at, k)
                for k, e in self._entries.items()
                if e._users == 0
            ),
        )
        chosen: list[str] = []
        for vpb, _, key in candidates:
            if free >= nbytes:
                break
            if vpb >= newcomer and not (vpb == 0 and newcomer == 0):
                break  # everything left is worth at least as much per byte as the newcomer
            chosen.append(key)
            free += self._entries[key].nbytes
        if free < nbytes:
            raise HostCacheFull(
                f"model needs {nbytes} bytes, {free} can be freed without evicting models worth more "
                f"per byte (value/byte {newcomer:.3g}); budget {self.budget_bytes}"
            )
        return chosen

    def evict(self, key: str) -> int:
        """Drop a staged model; returns the bytes freed. An entry being promoted is dropped from
        the cache at once and its memory is released when the promotion ends."""
        with self._lock:
            if key not in self._entries:
                return 0
            return self._drop_locked(key)

    def _drop_locked(self, key: str) -> int:
        entry = self._entries.pop(key)
        entry.tensors = {}  # drop our references now: the memory goes once no promotion holds it
        entry._evicted = True
        if entry._users == 0 and entry.arena is not None:
            entry.arena.release()  # else the last promotion to finish releases it
            entry.arena = None
        return entry.nbytes

    # -- stage / promote -------------------------------------------------------------------------
    def stage(
        self,
        key: str,
        source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        value: float = 0.0,
        progress: Progress | None = None,
        threads: int | None = None,
        expected: dict[str, tuple[torch.dtype, tuple[int, ...]]] | None = None,
        roots: Sequence[Path] | None = None,
    ) -> StagedModel:
        from gpu_worker.loader import load_weights, resolve_headers

        headers = None
        with self._lock:
            while True:
                while key in self._loading:  # a concurrent stage of the same key: wait for it
                    self._lock.wait()
                if key in self._entries:
                    entry = self._entries[key]
                    entry.value = max(entry.value, float(value))
                    return entry
                if headers is not None:
                    break
                # Validate (file I/O) without holding the lock, then look again.
                self._lock.release()
                try:
                    headers = resolve_headers(source, roots)  # roots: checked at every open
                finally:
                    self._lock.acquire()
            sizes = {name: e.nbytes for h in headers for name, e in h.tensors.items()}
            nbytes = sum(-(-n // HostArena.ALIGN) * HostArena.ALIGN for n in sizes.values())
            for victim in self._plan_locked(nbytes, value):
                self._drop_locked(victim)
            self._reserved[key] = nbytes
            self._loading.add(key)
        t0 = time.perf_counter()
        arena: HostArena | None = None
        try:
            arena = HostArena(sizes, pin=self.pinned)
            tensors = load_weights(
                headers,
                torch.device("cpu"),
                progress=progress,
                threads=threads,
                expected=expected,
                allocator=arena.allocate,
                roots=roots,
            )
            entry = StagedModel(
                key=key,
                tensors=tensors,
                nbytes=arena.nbytes,
                pinned=arena.pinned,
                value=float(value),
                stage_seconds=time.perf_counter() - t0,
                arena=arena,
            )
            with self._lock:
                self._entries[key] = entry
            return entry
        except BaseException:
            if arena is not None:
                arena.release()
            raise
        finally:
            with self._lock:
                self._reserved.pop(key, None)
                self._loading.discard(key)
                self._lock.notify_all()

    def promote(
        self, key: str, device: torch.device | str, *, progress: Progress | None = None
    ) -> dict[str, torch.Tensor]:
        """Copy a staged model to ``device``; the result owns its memory (on a CPU target too)."""
        device = torch.device(device)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                raise KeyError(f"model {key!r} is not staged in the host cache")
            entry._users += 1
            tensors = dict(entry.tensors)
        try:
            out = copy_tensors(tensors, device, progress=progress)
        finally:
            with self._lock:
                entry._users -= 1
                if entry._evicted and entry._users == 0 and entry.arena is not None:
                    entry.arena.release()  # evicted while we copied from it
                    entry.arena = None
                entry.promotions += 1
                entry.last_promoted_at = time.time()
        return out


def copy_tensors(
    tensors: dict[str, torch.Tensor],
    device: torch.device,
    *,
    progress: Progress | None = None,
    threads: int | None = None,
) -> dict[str, torch.Tensor]:
    """Copy host tensors into fresh tensors on ``device`` (non_blocking from pinned memory on CUDA,
    on a side stream, synchronised before returning; on a CPU target, ``threads`` threads of 8 MiB
    memmoves into huge-page-advised tensors). Frees what it allocated on failure."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    out: dict[str, torch.Tensor] = {}
    try:
        if device.type == "cuda":
            stream = torch.cuda.Stream(device=device)
            # Allocate on the current stream (the caching allocator ties blocks to the stream that
            # allocated them), copy on the side stream, then wait: the result is ready on return.
            for name, t in tensors.items():
                out[name] = torch.empty(t.shape, dtype=t.dtype, device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for name, t in tensors.items():
                    out[name].copy_(t, non_blocking=t.is_pinned())
            stream.synchronize()
        else:
            _copy_host(tensors, device, out, progress, threads or min(4, os.cpu_count() or 1), total)
        if progress is not None:
            progress(total, total)
        return out
    except BaseException:
        out.clear()
        raise


def _copy_host(
    tensors: dict[str, torch.Tensor],
    device: torch.device,
    out: dict[str, torch.Tensor],
    progress: Progress | None,
    threads: int,
    total: int,
) -> None:
    # torch's copy_ ran at ~1.4 GiB/s here where plain parallel memmoves into the same tensors ran
    # at ~7 GiB/s (its OpenMP workers contend with everything else on a 2-core machine).
    step = 8 * 1024 * 1024
    pieces: list[tuple[int, int, int]] = []
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        dst = torch.empty(t.shape, dtype=t.dtype, device=device)
        if nbytes >= 2 * HUGE_PAGE_BYTES:
            advise_hugepages(dst)  # 2 MiB faults: a 4 KiB-faulted copy runs at a third the speed
        out[name] = dst
        if not t.is_contiguous() or t.device.type != "cpu":
            dst.copy_(t)
            continue
        for off in range(0, nbytes, step):
            pieces.append((dst.data_ptr() + off, t.data_ptr() + off, min(step, nbytes - off)))
    done = [0] * threads
    stop = threading.Event()

    def part(i: int) -> None:  # ctypes releases the GIL: the threads copy in parallel
        for d, src, n in pieces[len(pieces) * i // threads : len(pieces) * (i + 1) // threads]:
            if stop.is_set():
                return
            ctypes.memmove(d, src, n)
            done[i] += n

    workers = [threading.Thread(target=part, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    try:
        while alive := [w for w in workers if w.is_alive()]:
            alive[0].join(0.05)
            if progress is not None and any(w.is_alive() for w in workers):
                progress(min(sum(done), total), total)
    finally:
        # A raising progress callback must not free the tensors under running memmoves.
        stop.set()
        for w in workers:
            w.join()
