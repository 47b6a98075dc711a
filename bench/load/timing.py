"""Timing one run of a contender: wall seconds, CPU seconds per label, and the GiB/s figures."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from .files import GiB

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
