"""`prewarm bench load`: how fast the loader fills a device, beside what the machine can do.

One run measures, on the same generated safetensors file (seeded, written to a temp dir):

- page-cache case (the file's pages resident), median over ``--runs`` interleaved rounds:
  ``raw_read`` (sequential reads into one small reused buffer, like ``cat FILE > /dev/null``),
  ``loader`` (:func:`gpu_worker.loader.load_weights` to the device), ``load_file``
  (``safetensors.torch.load_file`` + a copy into owned memory), and ``fresh_memcpy`` (the same
  bytes copied from RAM into tensors allocated exactly as the loader allocates them: the loader
  minus the file, the ceiling of any loader that must write every byte into new memory, which a
  raw read into one reused buffer never does), and, on a CPU target, the same loader and memcpy into
  *pre-faulted* device memory (``loader_prefaulted``, ``prefaulted_memcpy``: a
  :class:`gpu_worker.devmem.DeviceArena` of the model's size, faulted in once and reused by every run). The loader's
  default destinations are new memory, which the kernel must fault in and zero page by page while
  the reads first touch it; a GPU's memory exists before the load and is never faulted per load,
  so ``loader_prefaulted`` is the CPU analogue of a GPU load and ``loader`` is what a CPU virtual
  GPU (whose evicted bytes go back to the OS) pays. The order of the contenders rotates each round;
- the loader into new and into pre-faulted memory again, each run after ``--idle`` seconds (3) of
  rest, as a worker's loads come: on a VM whose freed memory goes back to its host, new memory faults
  are much slower then (``idle_loader_gib_s``), pre-faulted memory is unaffected;
- out-of-page-cache case: the same three reads after ``posix_fadvise(DONTNEED)`` on the file
  before each run (the resident fraction after dropping is reported: if the drop did not work the
  numbers say so);
- peak resident memory of a fresh process that loads the file once (loader, and load_file for
  comparison), against the model's bytes plus the staging pool bound;
- staged -> device promotion throughput through :class:`gpu_worker.staging.HostCache`;
- on CUDA: pinned host-to-device bandwidth and the loader's share of it.

It reports; it asserts nothing. Nothing here imports torch at import time (the CLI must start fast).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

GiB = float(1 << 30)
MiB = 1 << 20
# cat uses 128 KiB; 1 MiB reads measured faster here, so the baseline is the harder one to match.
_RAW_BUFFER = 1 * MiB


# --------------------------------------------------------------------------------------------------
# the model file


def write_model(path: Path, size_bytes: int, seed: int = 0) -> int:
    """Write a transformer-shaped safetensors file of about ``size_bytes`` (fp16 weights, fp32
    norms), streaming tensor by tensor so the writer never holds two copies. Returns data bytes."""
    import torch

    d = 2048 if size_bytes >= 512 * MiB else 1024 if size_bytes >= 64 * MiB else 256
    vocab = 8 * d
    shapes: list[tuple[str, tuple[int, ...], torch.dtype]] = [("embed.weight", (vocab, d), torch.float16)]
    per_layer = 12 * d * d * 2 + 2 * d * 4 + 9 * d * 2
    layers = max(1, round((size_bytes - vocab * d * 2) / per_layer))
    for i in range(layers):
        p = f"layers.{i}."
        shapes += [
            (p + "attn.qkv.weight", (3 * d, d), torch.float16),
            (p + "attn.qkv.bias", (3 * d,), torch.float16),
            (p + "attn.out.weight", (d, d), torch.float16),
            (p + "attn.out.bias", (d,), torch.float16),
            (p + "norm1.weight", (d,), torch.float32),
            (p + "mlp.up.weight", (4 * d, d), torch.float16),
            (p + "mlp.up.bias", (4 * d,), torch.float16),
            (p + "mlp.down.weight", (d, 4 * d), torch.float16),
            (p + "mlp.down.bias", (d,), torch.float16),
            (p + "norm2.weight", (d,), torch.float32),
        ]
    names = {torch.float16: "F16", torch.float32: "F32"}
    header: dict[str, object] = {"__metadata__": {"format": "pt", "generator": "prewarm bench load", "seed": str(seed)}}
    offset = 0
    for name, shape, dtype in shapes:
        n = 1
        for s in shape:
            n *= s
        nbytes = n * (2 if dtype == torch.float16 else 4)
        header[name] = {"dtype": names[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8 bytes
    gen = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for _name, shape, dtype in shapes:
            t = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
            f.write(t.numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())  # clean pages: DONTNEED can drop them for the cold runs
    return offset


# --------------------------------------------------------------------------------------------------
# page cache control


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(path: Path) -> float | None:
    """Fraction of the file's pages in the page cache (mincore), or None where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        size = path.stat().st_size
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
            page = mmap.PAGESIZE
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            try:
                if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                    return None
                return sum(v & 1 for v in vec) / pages
            finally:
                del addr
    except (OSError, AttributeError, TypeError, BufferError):
        return None


def warm_page_cache(path: Path) -> None:
    raw_read(path)


# --------------------------------------------------------------------------------------------------
# the contenders


def raw_read(path: Path) -> int:
    """`cat FILE > /dev/null`: sequential reads into one small reused buffer."""
    buf = bytearray(_RAW_BUFFER)
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while k := os.readv(fd, [buf]):
            n += k
    finally:
        os.close(fd)
    return n


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


_cpu_seconds: dict[str, list[float]] = {}


def _timed(fn: Callable[[], object], label: str | None = None) -> float:
    """Wall seconds of ``fn()``; with a label, also records the process's CPU seconds (all threads,
    user + system), which other tenants of a shared machine disturb far less than wall time."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    if label is not None:
        _cpu_seconds.setdefault(label, []).append(time.process_time() - c0)
    del out  # free outside the timed region: a load's result is kept, its freeing is not its cost
    return dt


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _gib_s(nbytes: int, seconds: list[float]) -> float:
    return nbytes / statistics.median(seconds) / GiB


def _spread(nbytes: int, seconds: list[float]) -> list[float]:
    return [round(nbytes / max(seconds) / GiB, 2), round(nbytes / min(seconds) / GiB, 2)]


# --------------------------------------------------------------------------------------------------
# peak RSS in a fresh process

_CHILD = r"""
import json, os, resource, sys
mode, path, threads, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import torch
dev = torch.device(device)
if dev.type == "cuda":
    torch.zeros(1, device=dev)  # the CUDA context's own memory belongs to the baseline
from gpu_worker.loader import load_weights
from safetensors.torch import load_file
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
def hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
def anon_huge():
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
base = rss()
huge0 = anon_huge()
try:  # reset the high-water mark to now: the peak is then the load's alone
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    reset = True
except OSError:
    reset = False
if mode == "loader":
    out = load_weights(path, dev, threads=threads or None)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
else:
    out = {k: v.clone() for k, v in load_file(path).items()}
held = sum(t.numel() * t.element_size() for t in out.values())
print(json.dumps({"baseline_rss_bytes": base, "peak_rss_bytes": hwm(), "hwm_reset": reset,
                  "result_bytes": held, "anon_huge_page_bytes": anon_huge() - huge0}))
"""


def measure_peak_rss(path: Path, mode: str, threads: int | None, device: str = "cpu") -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(path), str(threads or 0), device],
        capture_output=True, text=True, env=env, timeout=600,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------
# the benchmark


def run_bench(
    size_bytes: int,
    runs: int = 5,
    *,
    threads: int | None = None,
    chunk_bytes: int | None = None,
    directory: str | None = None,
    cold: bool = True,
    device: str | None = None,
    idle_seconds: float = 3.0,
    log: Callable[[str], None] = lambda _m: None,
) -> dict:
    import torch

    from gpu_worker.loader import DEFAULT_CHUNK_BYTES, DEFAULT_POOL_BYTES, default_threads, load_weights
    from gpu_worker.staging import HostCache

    chunk = chunk_bytes or DEFAULT_CHUNK_BYTES
    nthreads = threads or default_threads()
    dev = torch.device(device or ("cuda:0" if torch.cuda.is_available() else "cpu"))
    tmp = Path(tempfile.mkdtemp(prefix="prewarm-bench-", dir=directory))
    result: dict = {}
    try:
        path = tmp / "model.safetensors"
        log(f"writing a {size_bytes / GiB:.2f} GiB model to {path} ...")
        data_bytes = write_model(path, size_bytes)
        file_bytes = path.stat().st_size

        def loader_dev():
            out = load_weights(path, dev, threads=nthreads, chunk_bytes=chunk)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return out

        # Correctness first: a fast wrong loader is worth nothing.
        ref = load_file_copy(path)
        got = loader_dev()
        mismatched = [k for k in ref if not torch.equal(ref[k], got[k].cpu())]
        del ref, got
        if mismatched:
            raise RuntimeError(f"loader result differs from safetensors for {mismatched[:3]}")

        # ---- page-cache case: interleave the contenders per round so noise hits all alike
        from prewarm.safetensors_header import read_header

        header = read_header(path)
        src = torch.empty(data_bytes, dtype=torch.uint8)
        with open(path, "rb") as f:
            f.seek(header.data_offset)
            f.readinto(memoryview(src.numpy()))
        memcpy = functools.partial(fresh_memcpy, src, header, nthreads)  # the loader's thread count
        contenders: list[tuple[str, Callable[[], object]]] = [
            ("raw_read", lambda: raw_read(path)),
            ("loader", loader_dev),
            ("load_file", lambda: load_file_copy(path)),
            ("fresh_memcpy", memcpy),
        ]
        devmem: DeviceMemory | None = None
        if dev.type == "cpu":
            # Device memory that exists before the load (a GPU's HBM): faulted in once, reused.
            devmem = DeviceMemory(header)
            mem = devmem
            contenders += [
                ("loader_prefaulted",
                 lambda: load_weights(path, dev, threads=nthreads, chunk_bytes=chunk, allocator=mem.allocate)),
                ("prefaulted_memcpy", functools.partial(mem.memcpy, src, nthreads)),
            ]
            got = contenders[-2][1]()
            if any(not torch.equal(got[k], v) for k, v in load_file_copy(path).items()):
                raise RuntimeError("loader result into pre-faulted memory differs from safetensors")
            del got
            result["prefaulted_huge_page_fraction"] = _round(devmem.huge_page_fraction(), 3)
        times: dict[str, list[float]] = {name: [] for name, _ in contenders}
        warm_page_cache(path)
        log(f"page-cache runs ({runs}) ...")
        n = len(contenders)
        for k in range(runs):
            warm_page_cache(path)
            # Rotate the order each round: what ran before (memory it freed, caches it filled)
            # changes the next one's figure, and no contender should always follow the same one.
            for name, fn in contenders[k % n :] + contenders[: k % n]:
                times[name].append(_timed(fn, name))
        del memcpy, src
        # ---- the same loads after the machine sat idle, as a worker's loads usually come: on a VM
        # that hands freed guest memory back to its host (free page reporting), new memory is then no
        # longer backed and each fault also goes to the host; mapped memory is unaffected.
        if idle_seconds > 0:
            log(f"loads after {idle_seconds:g} s idle ({runs}) ...")
            idle_named = [c for c in contenders if c[0] in ("loader", "loader_prefaulted")]
            idle_times: dict[str, list[float]] = {name: [] for name, _ in idle_named}
            for k in range(runs):
                for name, fn in idle_named[k % len(idle_named) :] + idle_named[: k % len(idle_named)]:
                    warm_page_cache(path)
                    time.sleep(idle_seconds)
                    idle_times[name].append(_timed(fn))
            result["idle_seconds"] = idle_seconds
            for name, ts in idle_times.items():
                result[f"idle_{name}_gib_s"] = round(_gib_s(data_bytes, ts), 3)
            result["idle_spread_gib_s"] = {k: _spread(data_bytes, v) for k, v in idle_times.items()}
        del contenders
        if devmem is not None:
            result["prefaulted_fallback_tensors"] = devmem.arena.fallbacks  # 0: every run fit the arena
            del devmem, mem
        result.update(
            {
                "loader_gib_s": round(_gib_s(data_bytes, times["loader"]), 3),
                "raw_read_gib_s": round(_gib_s(file_bytes, times["raw_read"]), 3),
                "load_file_gib_s": round(_gib_s(data_bytes, times["load_file"]), 3),
                "fresh_memcpy_gib_s": round(_gib_s(data_bytes, times["fresh_memcpy"]), 3),
            }
        )
        loader_gib_s = _gib_s(data_bytes, times["loader"])
        raw_gib_s = _gib_s(file_bytes, times["raw_read"])
        result["ratio_to_raw_read"] = round(loader_gib_s / raw_gib_s, 3)
        result["ratio_to_load_file"] = round(loader_gib_s / _gib_s(data_bytes, times["load_file"]), 3)
        result["ratio_to_fresh_memcpy"] = round(loader_gib_s / _gib_s(data_bytes, times["fresh_memcpy"]), 3)
        if "loader_prefaulted" in times:
            pre_gib_s = _gib_s(data_bytes, times["loader_prefaulted"])
            result["loader_prefaulted_gib_s"] = round(pre_gib_s, 3)
            result["prefaulted_memcpy_gib_s"] = round(_gib_s(data_bytes, times["prefaulted_memcpy"]), 3)
            result["prefaulted_ratio_to_raw_read"] = round(pre_gib_s / raw_gib_s, 3)
            result["prefaulted_ratio_to_memcpy"] = round(
                pre_gib_s / _gib_s(data_bytes, times["prefaulted_memcpy"]), 3
            )
        # CPU seconds per GiB (median): the work each contender does, less sensitive to noise.
        result["cpu_s_per_gib"] = {
            k: round(statistics.median(_cpu_seconds[k]) / ((file_bytes if k == "raw_read" else data_bytes) / GiB), 4)
            for k in times
        }
        _cpu_seconds.clear()
        result["spread_gib_s"] = {k: _spread(data_bytes if k != "raw_read" else file_bytes, v) for k, v in times.items()}

        # ---- peak RSS of one load in a fresh process (CPU target: the bytes stay in the process)
        log("peak RSS (fresh processes) ...")
        warm_page_cache(path)
        peak = measure_peak_rss(path, "loader", nthreads, str(dev))
        peak_lf = measure_peak_rss(path, "load_file", nthreads)
        # The bound: the model's bytes (when they land in host memory: a CPU target) plus
        # the staging pool (the loader only uses one on CUDA).
        pool_bound = DEFAULT_POOL_BYTES
        host_model_bytes = data_bytes if dev.type == "cpu" else 0
        if "peak_rss_bytes" in peak:
            result["peak_rss_bytes"] = peak["peak_rss_bytes"]
            result["baseline_rss_bytes"] = peak["baseline_rss_bytes"]
            result["peak_rss_over_baseline_bytes"] = peak["peak_rss_bytes"] - peak["baseline_rss_bytes"]
            result["peak_rss_bound_bytes"] = host_model_bytes + pool_bound
            result["peak_within_bound"] = result["peak_rss_over_baseline_bytes"] <= host_model_bytes + pool_bound
            result["peak_rss_hwm_reset"] = peak["hwm_reset"]
            if dev.type == "cpu" and data_bytes:
                # How much of the loaded model the kernel backed with 2 MiB pages (MADV_HUGEPAGE).
                result["loader_huge_page_fraction"] = round(peak.get("anon_huge_page_bytes", 0) / data_bytes, 3)
        else:
            result["peak_rss_bytes"] = None
            result["peak_rss_error"] = peak.get("error")
        if "peak_rss_bytes" in peak_lf:
            result["load_file_peak_rss_over_baseline_bytes"] = peak_lf["peak_rss_bytes"] - peak_lf["baseline_rss_bytes"]

        # ---- out of the page cache
        if cold:
            log(f"out-of-page-cache runs ({runs}) ...")
            cold_times: dict[str, list[float]] = {"raw_read": [], "loader": [], "load_file": []}
            fractions: list[float] = []
            cold_contenders: list[tuple[str, Callable[[], object]]] = [
                ("raw_read", lambda: raw_read(path)),
                ("loader", loader_dev),
                ("load_file", lambda: load_file_copy(path)),
            ]
            for k in range(runs):
                for name, fn in cold_contenders[k % 3 :] + cold_contenders[: k % 3]:
                    drop_from_page_cache(path)
                    frac = resident_fraction(path)
                    if frac is not None:
                        fractions.append(frac)
                    cold_times[name].append(_timed(fn))
            result.update(
                {
                    "cold_loader_gib_s": round(_gib_s(data_bytes, cold_times["loader"]), 3),
                    "cold_raw_read_gib_s": round(_gib_s(file_bytes, cold_times["raw_read"]), 3),
                    "cold_load_file_gib_s": round(_gib_s(data_bytes, cold_times["load_file"]), 3),
                    "cold_resident_fraction_after_drop": round(max(fractions), 4) if fractions else None,
                }
            )
            result["cold_ratio_to_raw_read"] = round(result["cold_loader_gib_s"] / result["cold_raw_read_gib_s"], 3)
            result["cold_ratio_to_load_file"] = round(
                result["cold_loader_gib_s"] / result["cold_load_file_gib_s"], 3
            )
            result["cold_spread_gib_s"] = {
                k: _spread(data_bytes if k != "raw_read" else file_bytes, v) for k, v in cold_times.items()
            }

        # ---- staged -> device promotion (the host-memory tier)
        log("host cache: stage and promote runs ...")
        warm_page_cache(path)
        cache = HostCache(budget_bytes=data_bytes + MiB)
        stage_times = []
        promote_times = []
        for k in range(runs):
            # Stage from the page cache into one arena (pinned on CUDA), promote, evict: the
            # arena is a single fresh allocation every round, as a newly staged model's is.
            stage_times.append(_timed(lambda: cache.stage("bench", path, threads=nthreads)))
            promote_times.append(_timed(lambda: _promote(cache, dev)))
            if k < runs - 1:
                cache.evict("bench")
        result["stage_gib_s"] = round(_gib_s(data_bytes, stage_times), 3)
        result["staged_pinned"] = cache.pinned
        result["promote_gib_s"] = round(_gib_s(data_bytes, promote_times), 3)
        result["promote_speedup_over_loader"] = round(result["promote_gib_s"] / result["loader_gib_s"], 3)
        cache.evict("bench")

        # ---- CUDA: pinned host-to-device bandwidth, measured now, and the loader's share
        if dev.type == "cuda":
            result["h2d_pinned_gib_s"] = round(_h2d_bandwidth(dev, min(data_bytes, 1 << 30), runs), 3)
            result["loader_share_of_h2d"] = round(result["loader_gib_s"] / result["h2d_pinned_gib_s"], 3)
            result["promote_share_of_h2d"] = round(result["promote_gib_s"] / result["h2d_pinned_gib_s"], 3)

        result.update(
            {
                "device": str(dev),
                "model_bytes": data_bytes,
                "file_bytes": file_bytes,
                "tensors": None,
                "runs": runs,
                "threads": nthreads,
                "chunk_bytes": chunk,
                "raw_read_buffer_bytes": _RAW_BUFFER,
                "staging_pool_bytes": pool_bound,
                "cpu_count": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "torch": torch.__version__,
            }
        )
        result["tensors"] = len(header.tensors)
        result["self_max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _promote(cache, dev) -> dict:
    import torch

    out = cache.promote("bench", dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return out


def _h2d_bandwidth(dev, nbytes: int, runs: int) -> float:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    times = []
    for _ in range(max(3, runs)):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        dst.copy_(host, non_blocking=True)
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / GiB


# --------------------------------------------------------------------------------------------------
# CLI


def _fmt_report(r: dict) -> str:
    def gb(k: str) -> str:
        v = r.get(k)
        return f"{v:7.2f} GiB/s" if isinstance(v, int | float) else "      n/a"

    lines = [
        f"prewarm bench load: {r['model_bytes'] / GiB:.2f} GiB model ({r['tensors']} tensors) -> {r['device']}, "
        f"median of {r['runs']} runs, {r['threads']} threads, {r['chunk_bytes'] // MiB} MiB chunks, "
        f"{r['cpu_count']} CPUs, load average {r['load_average']}",
        "",
        "page cache                 median       [min..max GiB/s]",
    ]
    for key, label in (("raw_read", "raw read (cat-like)"), ("loader", "loader"),
                       ("load_file", "load_file + copy"), ("fresh_memcpy", "memcpy, same allocations"),
                       ("loader_prefaulted", "loader, pre-faulted dest"),
                       ("prefaulted_memcpy", "memcpy, pre-faulted dest")):
        if key in r["spread_gib_s"]:
            lo, hi = r["spread_gib_s"][key]
            lines.append(f"  {label:24s} {gb(key + '_gib_s')}  [{lo}..{hi}]")
    lines += [
        f"  loader / raw read        {r['ratio_to_raw_read']:.2f}x  (into new memory: the CPU virtual GPU's load)",
        f"  loader / load_file       {r['ratio_to_load_file']:.2f}x",
        f"  loader / memcpy ceiling  {r['ratio_to_fresh_memcpy']:.2f}x",
    ]
    if "prefaulted_ratio_to_raw_read" in r:
        lines += [
            f"  pre-faulted / raw read   {r['prefaulted_ratio_to_raw_read']:.2f}x  (into mapped memory: a GPU load's analogue)",
            f"  pre-faulted / memcpy     {r['prefaulted_ratio_to_memcpy']:.2f}x",
        ]
    if "idle_loader_gib_s" in r:
        idle = f"  after {r['idle_seconds']:g} s idle: loader {gb('idle_loader_gib_s').strip()}"
        if "idle_loader_prefaulted_gib_s" in r:
            idle += f", pre-faulted {gb('idle_loader_prefaulted_gib_s').strip()}"
        lines.append(idle)
    huge = [f"{label} {r[k]:.0%}" for k, label in (("loader_huge_page_fraction", "loader"),
                                                   ("prefaulted_huge_page_fraction", "pre-faulted arena"))
            if isinstance(r.get(k), int | float)]
    if huge:
        lines.append("  huge-page backed: " + ", ".join(huge))
    lines.append("  CPU s/GiB: " + ", ".join(f"{k} {v:.3f}" for k, v in r["cpu_s_per_gib"].items()))
    if r.get("peak_rss_bytes"):
        lines += [
            "",
            f"peak RSS of a loading process: {r['peak_rss_bytes'] / MiB:.0f} MiB "
            f"({r['peak_rss_over_baseline_bytes'] / MiB:.0f} MiB over its {r['baseline_rss_bytes'] / MiB:.0f} MiB "
            f"baseline; bound model + pool = {r['peak_rss_bound_bytes'] / MiB:.0f} MiB; "
            f"within: {r['peak_within_bound']})",
        ]
        if "load_file_peak_rss_over_baseline_bytes" in r:
            lines.append(
                f"  load_file + copy for comparison: {r['load_file_peak_rss_over_baseline_bytes'] / MiB:.0f} MiB over baseline"
            )
    if "cold_loader_gib_s" in r:
        lines += ["", f"out of page cache (fadvise DONTNEED before each run; resident after drop "
                      f"<= {r['cold_resident_fraction_after_drop']})"]
        for key, label in (("raw_read", "raw read"), ("loader", "loader"), ("load_file", "load_file + copy")):
            lo, hi = r["cold_spread_gib_s"][key]
            lines.append(f"  {label:24s} {gb('cold_' + key + '_gib_s')}  [{lo}..{hi}]")
        lines += [
            f"  loader / raw read        {r['cold_ratio_to_raw_read']:.2f}x",
            f"  loader / load_file       {r['cold_ratio_to_load_file']:.2f}x",
        ]
    lines += [
        "",
        f"host cache: stage {gb('stage_gib_s')}, promote staged -> {r['device']} {gb('promote_gib_s')} "
        f"({r['promote_speedup_over_loader']:.2f}x the loader from page cache; pinned: {r['staged_pinned']})",
    ]
    if "h2d_pinned_gib_s" in r:
        lines.append(
            f"pinned H2D {gb('h2d_pinned_gib_s')}; loader share {r['loader_share_of_h2d']:.2f}, "
            f"promote share {r['promote_share_of_h2d']:.2f}"
        )
    return "\n".join(lines)


def _parse_size(text: str) -> int:
    from prewarm.config import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_bench_load(args: argparse.Namespace) -> int:
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else (lambda _m: None)
    r = run_bench(
        args.size,
        args.runs,
        threads=args.threads,
        chunk_bytes=args.chunk,
        directory=args.dir,
        cold=not args.no_cold,
        device=args.device,
        idle_seconds=args.idle,
        log=log,
    )
    print(json.dumps(r, sort_keys=True) if args.json else _fmt_report(r))
    return 0


def add_load_parser(group: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = group.add_parser("load", help="loader throughput vs raw read and safetensors.load_file")
    p.add_argument("--size", type=_parse_size, default=1 << 30, help="model size, e.g. 1GiB (default)")
    p.add_argument("--runs", type=int, default=5, help="runs per contender; medians are reported")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--threads", type=int, default=None, help="loader threads (default: the loader's)")
    p.add_argument("--chunk", type=_parse_size, default=None, help="loader chunk size (default 8MiB)")
    p.add_argument("--dir", default=None, help="where to write the temporary model (default: $TMPDIR)")
    p.add_argument("--device", default=None, help="target device (default cuda:0 if present, else cpu)")
    p.add_argument("--no-cold", action="store_true", help="skip the out-of-page-cache runs")
    p.add_argument("--idle", type=float, default=3.0,
                   help="seconds idle before each of the after-idle loads (0: skip them; default 3)")
    p.set_defaults(func=cmd_bench_load)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench load` (sharing the `bench` group with any other registrar)."""
    try:
        from prewarm.cli import subgroup

        group = subgroup(subparsers, "bench", "benchmarks")
    except ImportError:
        existing = subparsers.choices.get("bench")
        if existing is None:
            existing = subparsers.add_parser("bench", help="benchmarks")
            existing._prewarm_sub = existing.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
        group = existing._prewarm_sub
    add_load_parser(group)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_worker.bench")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_load_parser(sub)
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
