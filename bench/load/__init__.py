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
- staged -> device promotion throughput through :class:`gpu_worker.host_cache.HostCache`;
- on CUDA: pinned host-to-device bandwidth and the loader's share of it.

It reports; it asserts nothing. Nothing here imports torch at import time (the CLI must start fast).

Its parts: files (the generated model, page-cache control), contenders (what is timed), timing,
peak (a fresh process's peak RSS), phases (one function per measurement), run (run_bench: the
phases in order), report (the text form), cli (`prewarm bench load`).
"""

from __future__ import annotations

from .cli import cmd_bench_load, register
from .files import write_model
from .report import fmt_report
from .run import run_bench

__all__ = ["cmd_bench_load", "fmt_report", "register", "run_bench", "write_model"]
