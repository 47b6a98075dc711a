"""The warmup rule every runtime shares: run an input until its latency is stable, bounded.

The same rule for every runtime (torch: gpu_worker/runtimes/torch_module.py, with WorkerOptions' defaults):
at least `min_passes` (the first pass is cold: allocator, kernels, an engine's graphs), stop when the
last two passes are within `tolerance` of each other, and never run more than `max_passes` or, once the
minimum is done, longer than `max_seconds` (a busy host may never look stable).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WarmupPolicy:
    min_passes: int = 3
    max_passes: int = 10
    tolerance: float = 0.15
    max_seconds: float = 5.0


def run_until_stable(one_pass: Callable[[], None], policy: WarmupPolicy,
                     check_cancel: Callable[[], None] | None = None) -> dict[str, Any]:
    """Call `one_pass` until its latency is stable; returns passes, stable, latency_ms, first_ms."""
    lat: list[float] = []
    stable = False
    started = time.perf_counter()
    for _ in range(max(policy.min_passes, policy.max_passes)):
        if check_cancel is not None:
            check_cancel()
        t0 = time.perf_counter()
        one_pass()
        lat.append(time.perf_counter() - t0)
        if len(lat) >= policy.min_passes and abs(lat[-1] - lat[-2]) <= policy.tolerance * max(lat[-1], lat[-2]):
            stable = True
            break
        if len(lat) >= policy.min_passes and time.perf_counter() - started > policy.max_seconds:
            break
    return {"passes": len(lat), "stable": stable, "latency_ms": round(lat[-1] * 1000, 3),
            "first_ms": round(lat[0] * 1000, 3)}
