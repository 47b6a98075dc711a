"""The load benchmark's measurements, one function per phase; each adds its figures to `result`.
run.run_bench calls them in order on one Setup (the generated file and the loader's settings)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contenders import DeviceMemory, fresh_memcpy, load_file_copy
from .files import GiB, MiB, drop_from_page_cache, raw_read, resident_fraction, warm_page_cache
from .peak import measure_peak_rss
from .timing import _cpu_seconds, _gib_s, _round, _spread, _timed

Contender = tuple[str, Callable[[], object]]


@dataclass
class Setup:
    path: Path
    dev: Any  # torch.device (torch is imported only when a run starts)
    data_bytes: int
    file_bytes: int
    threads: int
    chunk: int
    runs: int
    log: Callable[[str], None]

    def loader(self) -> dict:
        import torch

        from gpu_worker.loader import load_weights

        out = load_weights(self.path, self.dev, threads=self.threads, chunk_bytes=self.chunk)
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        return out


def check_correct(s: Setup) -> None:
    """Correctness first: a fast wrong loader is worth nothing."""
    import torch

    ref = load_file_copy(s.path)
    got = s.loader()
    mismatched = [k for k in ref if not torch.equal(ref[k], got[k].cpu())]
    if mismatched:
        raise RuntimeError(f"loader result differs from safetensors for {mismatched[:3]}")


def page_cache(s: Setup, header: Any, result: dict) -> tuple[list[Contender], DeviceMemory | None]:
    """The file's pages resident: the contenders interleaved per round so noise hits all alike.
    Returns the loader contenders for the after-idle phase and the pre-faulted memory they use."""
    import torch

    from gpu_worker.loader import load_weights

    path, dev, runs, nthreads = s.path, s.dev, s.runs, s.threads
    src = torch.empty(s.data_bytes, dtype=torch.uint8)
    with open(path, "rb") as f:
        f.seek(header.data_offset)
        f.readinto(memoryview(src.numpy()))
    memcpy = functools.partial(fresh_memcpy, src, header, nthreads)  # the loader's thread count
    contenders: list[Contender] = [
        ("raw_read", lambda: raw_read(path)),
        ("loader", s.loader),
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
             lambda: load_weights(path, dev, threads=nthreads, chunk_bytes=s.chunk, allocator=mem.allocate)),
            ("prefaulted_memcpy", functools.partial(mem.memcpy, src, nthreads)),
        ]
        got = contenders[-2][1]()
        if any(not torch.equal(got[k], v) for k, v in load_file_copy(path).items()):
            raise RuntimeError("loader result into pre-faulted memory differs from safetensors")
        del got
        result["prefaulted_huge_page_fraction"] = _round(devmem.huge_page_fraction(), 3)
    times: dict[str, list[float]] = {name: [] for name, _ in contenders}
    warm_page_cache(path)
    s.log(f"page-cache runs ({runs}) ...")
    n = len(contenders)
    for k in range(runs):
        warm_page_cache(path)
        # Rotate the order each round: what ran before (memory it freed, caches it filled)
        # changes the next one's figure, and no contender should always follow the same one.
        for name, fn in contenders[k % n :] + contenders[: k % n]:
            times[name].append(_timed(fn, name))
    data_bytes, file_bytes = s.data_bytes, s.file_bytes
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
        result["prefaulted_ratio_to_memcpy"] = round(pre_gib_s / _gib_s(data_bytes, times["prefaulted_memcpy"]), 3)
    # CPU seconds per GiB (median): the work each contender does, less sensitive to noise.
    result["cpu_s_per_gib"] = {
        k: round(statistics.median(_cpu_seconds[k]) / ((file_bytes if k == "raw_read" else data_bytes) / GiB), 4)
        for k in times
    }
    _cpu_seconds.clear()
    result["spread_gib_s"] = {k: _spread(data_bytes if k != "raw_read" else file_bytes, v) for k, v in times.items()}
    # (the memcpy source is freed on return; the loaders keep only the file and the pre-faulted memory)
    return [c for c in contenders if c[0] in ("loader", "loader_prefaulted")], devmem


def after_idle(s: Setup, loaders: list[Contender], idle_seconds: float, result: dict) -> None:
    """The same loads after the machine sat idle, as a worker's loads usually come: on a VM that hands
    freed guest memory back to its host (free page reporting), new memory is then no longer backed and
    each fault also goes to the host; mapped memory is unaffected."""
    s.log(f"loads after {idle_seconds:g} s idle ({s.runs}) ...")
    idle_times: dict[str, list[float]] = {name: [] for name, _ in loaders}
    for k in range(s.runs):
        for name, fn in loaders[k % len(loaders) :] + loaders[: k % len(loaders)]:
            warm_page_cache(s.path)
            time.sleep(idle_seconds)
            idle_times[name].append(_timed(fn))
    result["idle_seconds"] = idle_seconds
    for name, ts in idle_times.items():
        result[f"idle_{name}_gib_s"] = round(_gib_s(s.data_bytes, ts), 3)
    result["idle_spread_gib_s"] = {k: _spread(s.data_bytes, v) for k, v in idle_times.items()}


def peak_rss(s: Setup, pool_bound: int, result: dict) -> None:
    """Peak RSS of one load in a fresh process (CPU target: the bytes stay in the process)."""
    s.log("peak RSS (fresh processes) ...")
    warm_page_cache(s.path)
    peak = measure_peak_rss(s.path, "loader", s.threads, str(s.dev))
    peak_lf = measure_peak_rss(s.path, "load_file", s.threads)
    # The bound: the model's bytes (when they land in host memory: a CPU target) plus
    # the staging pool (the loader only uses one on CUDA).
    host_model_bytes = s.data_bytes if s.dev.type == "cpu" else 0
    if "peak_rss_bytes" in peak:
        result["peak_rss_bytes"] = peak["peak_rss_bytes"]
        result["baseline_rss_bytes"] = peak["baseline_rss_bytes"]
        result["peak_rss_over_baseline_bytes"] = peak["peak_rss_bytes"] - peak["baseline_rss_bytes"]
        result["peak_rss_bound_bytes"] = host_model_bytes + pool_bound
        result["peak_within_bound"] = result["peak_rss_over_baseline_bytes"] <= host_model_bytes + pool_bound
        result["peak_rss_hwm_reset"] = peak["hwm_reset"]
        if s.dev.type == "cpu" and s.data_bytes:
            # How much of the loaded model the kernel backed with 2 MiB pages (MADV_HUGEPAGE).
            result["loader_huge_page_fraction"] = round(peak.get("anon_huge_page_bytes", 0) / s.data_bytes, 3)
    else:
        result["peak_rss_bytes"] = None
        result["peak_rss_error"] = peak.get("error")
    if "peak_rss_bytes" in peak_lf:
        result["load_file_peak_rss_over_baseline_bytes"] = peak_lf["peak_rss_bytes"] - peak_lf["baseline_rss_bytes"]


def out_of_cache(s: Setup, result: dict) -> None:
    """The three reads after posix_fadvise(DONTNEED) before each run; the resident fraction after the
    drop is reported, so a drop that did not work shows in the figures."""
    s.log(f"out-of-page-cache runs ({s.runs}) ...")
    path, data_bytes, file_bytes = s.path, s.data_bytes, s.file_bytes
    cold_times: dict[str, list[float]] = {"raw_read": [], "loader": [], "load_file": []}
    fractions: list[float] = []
    cold_contenders: list[Contender] = [
        ("raw_read", lambda: raw_read(path)),
        ("loader", s.loader),
        ("load_file", lambda: load_file_copy(path)),
    ]
    for k in range(s.runs):
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
    result["cold_ratio_to_load_file"] = round(result["cold_loader_gib_s"] / result["cold_load_file_gib_s"], 3)
    result["cold_spread_gib_s"] = {
        k: _spread(data_bytes if k != "raw_read" else file_bytes, v) for k, v in cold_times.items()
    }


def promotion(s: Setup, result: dict) -> None:
    """Staged -> device promotion through the worker's HostCache (the host-memory tier)."""
    import torch

    from gpu_worker.host_cache import HostCache

    s.log("host cache: stage and promote runs ...")
    warm_page_cache(s.path)
    cache = HostCache(budget_bytes=s.data_bytes + MiB)

    def promote() -> dict:
        out = cache.promote("bench", s.dev)
        if s.dev.type == "cuda":
            torch.cuda.synchronize(s.dev)
        return out

    stage_times = []
    promote_times = []
    for k in range(s.runs):
        # Stage from the page cache into one arena (pinned on CUDA), promote, evict: the
        # arena is a single fresh allocation every round, as a newly staged model's is.
        stage_times.append(_timed(lambda: cache.stage("bench", s.path, threads=s.threads)))
        promote_times.append(_timed(promote))
        if k < s.runs - 1:
            cache.evict("bench")
    result["stage_gib_s"] = round(_gib_s(s.data_bytes, stage_times), 3)
    result["staged_pinned"] = cache.pinned
    result["promote_gib_s"] = round(_gib_s(s.data_bytes, promote_times), 3)
    result["promote_speedup_over_loader"] = round(result["promote_gib_s"] / result["loader_gib_s"], 3)
    cache.evict("bench")


def h2d(s: Setup, result: dict) -> None:
    """CUDA: pinned host-to-device bandwidth, measured now, and the loader's and promotion's share."""
    import torch

    nbytes = min(s.data_bytes, 1 << 30)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=s.dev)
    times = []
    for _ in range(max(3, s.runs)):
        torch.cuda.synchronize(s.dev)
        t0 = time.perf_counter()
        dst.copy_(host, non_blocking=True)
        torch.cuda.synchronize(s.dev)
        times.append(time.perf_counter() - t0)
    result["h2d_pinned_gib_s"] = round(nbytes / statistics.median(times) / GiB, 3)
    result["loader_share_of_h2d"] = round(result["loader_gib_s"] / result["h2d_pinned_gib_s"], 3)
    result["promote_share_of_h2d"] = round(result["promote_gib_s"] / result["h2d_pinned_gib_s"], 3)
