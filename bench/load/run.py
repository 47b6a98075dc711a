"""run_bench: one run of the load benchmark, its phases in order on one generated file."""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import phases
from .files import RAW_BUFFER, GiB, write_model


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

    from gpu_worker.loader import DEFAULT_CHUNK_BYTES, DEFAULT_POOL_BYTES, default_threads
    from prewarm.safetensors_header import read_header

    chunk = chunk_bytes or DEFAULT_CHUNK_BYTES
    nthreads = threads or default_threads()
    dev = torch.device(device or ("cuda:0" if torch.cuda.is_available() else "cpu"))
    tmp = Path(tempfile.mkdtemp(prefix="prewarm-bench-", dir=directory))
    result: dict = {}
    try:
        path = tmp / "model.safetensors"
        log(f"writing a {size_bytes / GiB:.2f} GiB model to {path} ...")
        data_bytes = write_model(path, size_bytes)
        s = phases.Setup(path, dev, data_bytes, path.stat().st_size, nthreads, chunk, runs, log)
        phases.check_correct(s)
        header = read_header(path)
        loaders, devmem = phases.page_cache(s, header, result)
        if idle_seconds > 0:
            phases.after_idle(s, loaders, idle_seconds, result)
        del loaders
        if devmem is not None:
            result["prefaulted_fallback_tensors"] = devmem.arena.fallbacks  # 0: every run fit the arena
            del devmem
        phases.peak_rss(s, DEFAULT_POOL_BYTES, result)
        if cold:
            phases.out_of_cache(s, result)
        phases.promotion(s, result)
        if dev.type == "cuda":
            phases.h2d(s, result)
        result.update(
            {
                "device": str(dev),
                "model_bytes": data_bytes,
                "file_bytes": s.file_bytes,
                "tensors": len(header.tensors),
                "runs": runs,
                "threads": nthreads,
                "chunk_bytes": chunk,
                "raw_read_buffer_bytes": RAW_BUFFER,
                "staging_pool_bytes": DEFAULT_POOL_BYTES,
                "cpu_count": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "torch": torch.__version__,
            }
        )
        result["self_max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
