"""The streaming weights loader: safetensors bytes straight into tensors the device owns.

Steps (issue 4):

1. Every header is read and validated (``prewarm.safetensors_header``) before any tensor byte is
   read: offsets inside the file, no overlap, sizes that match dtype x shape, and, when the caller
   passes ``expected``, names/dtypes/shapes that match the module's parameters.
2. Each destination tensor is allocated once on the target device.
3. The data sections are cut into chunks of ``chunk_bytes`` (a chunk may span several small
   tensors: one ``preadv`` scatters it into each of their buffers) and a bounded pool of threads
   reads them with ``os.preadv`` (no GIL held while the kernel copies). Each thread walks its own
   contiguous stripe of the chunk list through its own open file (the kernel keeps readahead state
   per open file: interleaved readers on one file defeat it, which halved cold-cache throughput
   here), taking over half of another thread's remaining stripe when its own is done; stripes
   over a sharded set put threads on different shards, so shards load in parallel:
   - CPU target: straight into the destination tensors' memory. No intermediate copy; the result
     owns its memory (it is not a view of an mmap or of the page cache). New memory (the default
     allocation) is faulted in and zeroed by the kernel as the reads first touch it, which costs about
     as much as the copy; an ``allocator`` over already-mapped memory
     (:class:`gpu_worker.devmem.DeviceArena`, as a GPU's memory is) avoids that (docs/worker.md).
   - CUDA target: into a per-thread ring of pinned host buffers (:class:`ReadRing`), each chunk
     then copied ``non_blocking`` on the thread's side stream while the thread reads the next one.
     ``staged=True`` forces this path on CPU too (a synchronous copy), which is how the shared
     logic is tested without a GPU.
4. Progress ``(bytes_done, bytes_total)`` is reported from the calling thread at most every
   ``progress_interval`` seconds and once at the end; an exception raised by the callback cancels
   the load (that is how a worker aborts a preload).

On any failure the loader stops its threads, drops every tensor it allocated (the exception it
raises carries no frame that still references them) and raises :class:`SafetensorsError` (bad
file or index) or :class:`LoadError` (I/O error, a file that changed under us, a failed
allocation, a mismatch with ``expected``). Nothing is ever unpickled.

API::

    load_weights(source, device, *, progress=None, threads=None, chunk_bytes=DEFAULT_CHUNK_BYTES,
                 expected=None, staged=None, pool_bytes=DEFAULT_POOL_BYTES, allocator=None,
                 progress_interval=0.1, roots=None) -> dict[str, torch.Tensor]
        # source: a .safetensors path, an index json, a directory holding either, or a list of shard
        #   paths / validated headers. Raises SafetensorsError (bad file, missing shard) or
        #   LoadError (I/O, file changed, allocation failed; WeightMismatchError for ``expected``);
        #   an exception raised by ``progress`` propagates unchanged after the load is torn down.
    expected_from_module(module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]
    resolve_headers(source, roots=None) -> list[SafetensorsHeader]

``roots`` (the catalog's model roots; the worker always passes them): every file is opened through
``prewarm.model_roots.open_inside``, when its header is read and again when its bytes are, and the second
open must find the very file whose header was validated: a file outside the roots, or one swapped (for a
symlink or another file) after the catalog was read, is refused before any of its bytes is read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_worker.hostmem import HUGE_PAGE_BYTES, advise_hugepages
from gpu_worker.read_ring import ReadRing
from prewarm.model_roots import RefusedFile, open_inside
from prewarm.safetensors_header import (
    SafetensorsError,
    SafetensorsHeader,
    read_header,
    read_weight_set,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_POOL_BYTES",
    "LoadError",
    "SafetensorsError",
    "TORCH_DTYPES",
    "WeightMismatchError",
    "default_threads",
    "expected_from_module",
    "load_weights",
    "resolve_headers",
]

MiB = 1 << 20
DEFAULT_CHUNK_BYTES = 8 * MiB
DEFAULT_POOL_BYTES = 256 * MiB
# Linux IOV_MAX: one preadv scatters into at most this many buffers.
_IOV_MAX = 1024

TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "F32": torch.float32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F64": torch.float64,
    "C64": torch.complex64,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3": torch.float8_e4m3fn,
}
if hasattr(torch, "float8_e8m0fnu"):
    TORCH_DTYPES["F8_E8M0"] = torch.float8_e8m0fnu

Progress = Callable[[int, int], None]
Expected = dict[str, tuple[torch.dtype, tuple[int, ...]]]
Allocator = Callable[[str, tuple[int, ...], torch.dtype], torch.Tensor]
Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Sequence[SafetensorsHeader]


class LoadError(RuntimeError):
    """A load that failed for a reason other than a malformed file (I/O, mismatch, cancellation)."""


class WeightMismatchError(LoadError):
    """The file's tensors do not match what the module expects (names, dtypes or shapes)."""


def default_threads() -> int:
    """Reader threads: from the page cache two per core saturate the kernel's copy; storage wants
    queue depth, so keep at least 4 and at most 16."""
    return max(4, min(16, 2 * (os.cpu_count() or 1)))


def expected_from_module(module: torch.nn.Module) -> Expected:
    """``{name: (dtype, shape)}`` for a module's state dict (works on a meta-device module)."""
    return {k: (v.dtype, tuple(v.shape)) for k, v in module.state_dict().items()}


def resolve_headers(source: Source, roots: Sequence[Path] | None = None) -> list[SafetensorsHeader]:
    """Validated headers for a path (file, index json, directory) or a list of shard paths/headers.

    Tensor names must be unique across the files."""
    if isinstance(source, str | os.PathLike):
        return read_weight_set(source, roots).headers
    headers = [s if isinstance(s, SafetensorsHeader) else read_header(s, roots) for s in source]
    seen: dict[str, Path] = {}
    for h in headers:
        for name in h.tensors:
            if name in seen:
                raise SafetensorsError(
                    h.path, f"tensor {name!r}", f"also stored in {seen[name]}: ambiguous", "remove the duplicate"
                )
            seen[name] = h.path
    return headers


def _check_expected(headers: list[SafetensorsHeader], expected: Expected) -> None:
    found = {name: (h, e) for h in headers for name, e in h.tensors.items()}
    problems: list[str] = []
    missing = [n for n in expected if n not in found]
    extra = [n for n in found if n not in expected]
    if missing:
        problems.append(f"missing from the weights: {_names(missing)}")
    if extra:
        problems.append(f"not in the module: {_names(extra)}")
    for name, (dtype, shape) in expected.items():
        if name not in found:
            continue
        h, e = found[name]
        got_dtype = TORCH_DTYPES[e.dtype]
        if got_dtype != dtype or tuple(e.shape) != tuple(shape):
            problems.append(
                f"tensor {name!r} in {h.path.name}: expected {_fmt(dtype, shape)}, found {_fmt(got_dtype, e.shape)}"
            )
    if problems:
        shown = problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
        raise WeightMismatchError(
            "weights do not match the module: " + "; ".join(shown)
            + " — check that the catalog entry's builder matches these weights"
        )


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")


def _fmt(dtype: torch.dtype, shape: Sequence[int]) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


@dataclass(slots=True)
class _Chunk:
    """A contiguous file range ``[offset, offset + nbytes)`` of one file, scattered into
    ``segments`` = (tensor name, byte offset in that tensor, length)."""

    file: int
    offset: int
    nbytes: int
    segments: list[tuple[str, int, int]]


def _plan(headers: list[SafetensorsHeader], chunk_bytes: int) -> list[_Chunk]:
    """Cut each file's data section into chunks, interleaving files so shards load in parallel."""
    per_file: list[list[_Chunk]] = []
    for fi, h in enumerate(headers):
        chunks: list[_Chunk] = []
        cur: _Chunk | None = None
        for e in h.tensors.values():  # data-section order, contiguous (validated)
            done = 0
            while done < e.nbytes:
                if cur is None or cur.nbytes == chunk_bytes or len(cur.segments) == _IOV_MAX:
                    cur = _Chunk(fi, h.data_offset + e.begin + done, 0, [])
                    chunks.append(cur)
                n = min(e.nbytes - done, chunk_bytes - cur.nbytes)
                cur.segments.append((e.name, done, n))
                cur.nbytes += n
                done += n
        per_file.append(chunks)
    # File after file: threads take contiguous stripes of this list (see _Stripes), so each walks
    # one file forward and, with more threads than shards, shards load side by side.
    return [c for chunks in per_file for c in chunks]


class _Stripes:
    """Hands out plan indices: thread ``t`` walks its own contiguous stripe in order (a sequential
    read per open file keeps the kernel's readahead effective); a thread whose stripe is done takes
    the back half of the longest remaining one, so a slow thread does not hold the load back."""

    def __init__(self, items: int, threads: int):
        bounds = [items * i // threads for i in range(threads + 1)]
        self._ranges = [[bounds[i], bounds[i + 1]] for i in range(threads)]
        self._lock = threading.Lock()

    def take(self, t: int) -> tuple[int, int | None] | None:
        """``(index, next index this thread will read or None)``, or None when all is handed out."""
        with self._lock:
            mine = self._ranges[t]
            if mine[0] >= mine[1]:
                victim = max(self._ranges, key=lambda r: r[1] - r[0])
                left = victim[1] - victim[0]
                if left <= 0:
                    return None
                steal = max(1, left // 2)
                mine[0], mine[1] = victim[1] - steal, victim[1]
                victim[1] -= steal
            i = mine[0]
            mine[0] += 1
            return i, (mine[0] if mine[0] < mine[1] else None)

    def cancel(self) -> None:
        with self._lock:
            for r in self._ranges:
                r[0] = r[1]


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor sharing its memory."""
    return t.reshape(-1).view(torch.uint8)


def _allocate(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One destination tensor, allocated once, never initialised (the reads fill every byte)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if device.type == "cpu" and t.numel() * t.element_size() >= 2 * HUGE_PAGE_BYTES:
        advise_hugepages(t)  # before the reads first touch it: 2 MiB faults, not 4 KiB ones
    return t


def _checked(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    if tuple(t.shape) != tuple(shape) or t.dtype != TORCH_DTYPES[dtype] or not t.is_contiguous():
        raise LoadError(
            f"allocator returned {_fmt(t.dtype, t.shape)} for tensor {name!r}, "
            f"expected a contiguous {_fmt(TORCH_DTYPES[dtype], shape)}"
        )
    return t


def _preadv_full(fd: int, bufs: list[memoryview], offset: int, path: Path) -> None:
    """``preadv`` until every buffer is full; a short read means the file shrank after validation."""
    total = sum(len(b) for b in bufs)
    got = os.preadv(fd, bufs, offset)
    while got < total:
        if got == 0:
            raise LoadError(
                f"{path}: file ended at offset {offset} while reading tensor data "
                "(it was truncated or replaced during the load); re-export or re-download it"
            )
        # Rare (signals, huge requests): drop what was filled and continue.
        offset += got
        total -= got
        rest: list[memoryview] = []
        for b in bufs:
            if got >= len(b):
                got -= len(b)
                continue
            rest.append(b[got:])
            got = 0
        bufs = rest
        got = os.preadv(fd, bufs, offset)


def load_weights(
    source: Source,
    device: torch.device | str,
    *,
    progress: Progress | None = None,
    threads: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    expected: Expected | None = None,
    staged: bool | None = None,
    pool_bytes: int = DEFAULT_POOL_BYTES,
    allocator: Allocator | None = None,
    progress_interval: float = 0.1,
    roots: Sequence[Path] | None = None,
) -> dict[str, torch.Tensor]:
    """Load every tensor of ``source`` onto ``device``; see the module docstring.

    ``source``: a ``.safetensors`` path, an index json, a directory, or a list of shard paths (or
    already-validated headers). ``staged``: read through host staging buffers (default: only for
    non-CPU devices). ``pool_bytes`` bounds the staging buffers. ``allocator(name, shape, dtype)``
    replaces ``torch.empty`` on ``device`` for the destinations (the host cache carves them out of
    one pinned arena); it must return contiguous tensors of that shape and dtype on ``device``.
    ``roots``: the model roots every file must really lie in (checked at each open; see the module doc).
    """
    device = torch.device(device)
    if chunk_bytes < 4096:
        raise ValueError("chunk_bytes must be at least 4096")
    headers = resolve_headers(source, roots)
    if expected is not None:
        _check_expected(headers, expected)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LoadError(f"cannot load onto {device}: torch.cuda.is_available() is False on this machine")
    if device.type not in ("cpu", "cuda"):
        raise LoadError(f"cannot load onto {device}: only cpu and cuda devices are supported")
    staged = device.type != "cpu" if staged is None else staged
    nthreads = max(1, threads or default_threads())
    total = sum(h.data_bytes for h in headers)
    depth = 2
    # Small models: smaller chunks (not under 1 MiB) so every thread gets a few to read.
    chunk_bytes = max(min(chunk_bytes, MiB), min(chunk_bytes, total // (4 * nthreads)))
    if staged:
        # The pool bound wins over the chunk size: threads x depth buffers of chunk_bytes.
        chunk_bytes = max(4096, min(chunk_bytes, pool_bytes // (nthreads * depth)))
    plan = _plan(headers, chunk_bytes)
    nthreads = min(nthreads, max(1, len(plan)))

    tensors: dict[str, torch.Tensor] = {}
    fds: list[int] = []
    try:
        for h in headers:
            for name, e in h.tensors.items():
                try:
                    # No local name for the tensor: this frame outlives a failure in its traceback.
                    tensors[name] = (
                        _allocate(e.shape, TORCH_DTYPES[e.dtype], device)
                        if allocator is None
                        else _checked(allocator(name, e.shape, TORCH_DTYPES[e.dtype]), name, e.shape, e.dtype)
                    )
                except RuntimeError as exc:  # out of (device) memory, or a device torch cannot use
                    raise LoadError(
                        f"allocating tensor {name!r} ({e.nbytes} bytes) on {device} failed "
                        f"after {sum(t.numel() * t.element_size() for t in tensors.values())} bytes: {exc}"
                    ) from None
        for h in headers:
            try:
                fds.append(open_inside(h.path, roots))
                st = os.fstat(fds[-1])
            except RefusedFile as exc:
                raise LoadError(str(exc)) from None
            except OSError as exc:
                raise LoadError(f"{h.path}: cannot open for reading: {exc.strerror or exc}") from None
            if h.identity != (0, 0) and (st.st_dev, st.st_ino) != h.identity:
                raise LoadError(f"{h.path}: is another file now than the one whose header was read (replaced "
                                "during the load); retry once the file is in place")
            size = st.st_size
            if size != h.file_size:  # replaced or rewritten since its header was validated
                raise LoadError(
                    f"{h.path}: file is {size} bytes now, {h.file_size} when its header was read "
                    "(changed during the load); retry once the file is complete"
                )
        _run(plan, headers, fds, tensors, device, staged, nthreads, chunk_bytes, depth, total, progress,
             progress_interval)
        return tensors
    except BaseException:
        tensors.clear()  # the traceback keeps this frame alive: release the memory now
        raise
    finally:
        for fd in fds:
            os.close(fd)


def _run(
    plan: list[_Chunk],
    headers: list[SafetensorsHeader],
    fds: list[int],
    tensors: dict[str, torch.Tensor],
    device: torch.device,
    staged: bool,
    nthreads: int,
    chunk_bytes: int,
    depth: int,
    total: int,
    progress: Progress | None,
    progress_interval: float,
) -> None:
    lock = threading.Lock()
    state = {"done": 0}
    failure: list[BaseException] = []
    stripes = _Stripes(len(plan), nthreads)

    if staged:
        dests = {name: _byte_view(t) for name, t in tensors.items()}
    else:
        # One writable memoryview per tensor over its own memory: preadv fills it in place.
        dests = {name: memoryview(_byte_view(t).numpy()) for name, t in tensors.items()}

    class Reader:
        """One thread's own file descriptors (the kernel keeps readahead state per open file)."""

        def __init__(self, t: int):
            self.t = t
            self.fds: dict[int, int] = {}

        def fd(self, f: int) -> int:
            fd = self.fds.get(f)
            if fd is None:
                # Reopen the inode we validated (not the path, which may point elsewhere by now):
                # a new open file has its own readahead window, which a shared one would not.
                try:
                    fd = os.open(f"/proc/self/fd/{fds[f]}", os.O_RDONLY)
                except OSError:
                    fd = os.dup(fds[f])
                self.fds[f] = fd
                if hasattr(os, "posix_fadvise"):
                    # We walk the stripe forward: ask for the larger readahead window.
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            return fd

        def next(self) -> _Chunk | None:
            # (WILLNEED on the following chunk was tried: no measurable gain over readahead.)
            got = stripes.take(self.t)
            return None if got is None else plan[got[0]]

        def read(self, c: _Chunk, bufs: list[memoryview]) -> None:
            path = headers[c.file].path
            try:
                _preadv_full(self.fd(c.file), bufs, c.offset, path)
            except OSError as exc:
                raise LoadError(
                    f"{path}: reading bytes [{c.offset}, {c.offset + c.nbytes}) failed: {exc.strerror or exc} "
                    f"(errno {exc.errno}); check the storage device"
                ) from None

        def close(self) -> None:
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()

    def record(n: int) -> None:
        with lock:
            state["done"] += n

    def fail(exc: BaseException) -> None:
        # Keep the message, not the traceback: its frames would pin destination memory.
        with lock:
            if not failure:
                failure.append(exc)
        stripes.cancel()

    def direct_worker(t: int) -> None:
        r = Reader(t)
        try:
            while (c := r.next()) is not None:
                r.read(c, [dests[name][off : off + n] for name, off, n in c.segments])
                record(c.nbytes)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            fail(_wrap(exc))
        finally:
            r.close()

    def staged_worker(t: int) -> None:
        r = Reader(t)
        ring: ReadRing | None = None
        try:
            ring = ReadRing(chunk_bytes, depth, device, after=alloc_stream)
            while (c := r.next()) is not None:
                i = ring.acquire()
                r.read(c, [ring.views[i][: c.nbytes]])
                segs = []
                buf_off = 0
                for name, off, n in c.segments:
                    segs.append((dests[name], off, buf_off, n))
                    buf_off += n
                ring.submit(i, segs)
                record(c.nbytes)
            ring.drain()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            fail(_wrap(exc))
        finally:
            r.close()
            if ring is not None:
                try:
                    ring.close()
                except BaseException as exc:  # noqa: BLE001
                    fail(_wrap(exc))

    # Copies must follow the allocations, which ran on the caller's current stream (thread-local:
    # the workers' own current stream is the default one).
    alloc_stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    target = staged_worker if staged else direct_worker
    workers = [
        threading.Thread(target=target, args=(i,), name=f"prewarm-load-{i}", daemon=True) for i in range(nthreads)
    ]
    for w in workers:
        w.start()
    try:
        last_reported = -1
        while alive := [w for w in workers if w.is_alive()]:
            alive[0].join(progress_interval)
            # Progress is reported from the caller's thread, throttled by the join timeout.
            if progress is not None and not failure:
                with lock:
                    done = state["done"]
                if done != last_reported and done != total:
                    progress(done, total)
                    last_reported = done
    except BaseException:
        stripes.cancel()
        for w in workers:
            w.join()
        dests.clear()
        raise
    dests.clear()
    if failure:
        exc = failure[0]
        failure.clear()
        raise exc
    if state["done"] != total:  # cannot happen unless the plan is wrong: never return garbage
        raise LoadError(f"internal error: read {state['done']} of {total} bytes")
    if progress is not None:
        progress(total, total)


def _wrap(exc: BaseException) -> BaseException:
    """The exception to re-raise in the caller, without the worker frames that pin tensors."""
    if not isinstance(exc, LoadError | SafetensorsError):
        exc = LoadError(f"load failed: {type(exc).__name__}: {exc}")
    # Worker frames (in the traceback and in any chained exception's) hold memoryviews of the
    # destination tensors; a caller keeping the exception must not keep the memory.
    exc.__traceback__ = None
    exc.__context__ = None
    exc.__cause__ = None
    return exc
