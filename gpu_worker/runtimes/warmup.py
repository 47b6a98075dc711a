"""The warmup rule every runtime shares: run an input until its latency is stable, bounded.

The same rule for every runtime (torch: gpu_worker/runtimes/torch_module.py, with WorkerOptions' defaults):
stop when the last two passes are within `tolerance` of each other (after at least `min_passes`: the
first pass is cold: allocator, kernels, an engine's graphs), and never run more than `max_passes`.
`max_seconds` (PREWARM_WARMUP_MAX_SECONDS) is a hard ceiling per input that no minimum overrides: a pass
is started only when it is expected to end within it (the time so far plus the last pass's latency). The
first pass always runs, and may take longer on its own; a warmup stopped by the ceiling before its
minimum passes is `cut_short` (the runtime says so in its figures and the log, the worker in its event).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WarmupPolicy:
    min_passes: int = 3
    max_passes: int = 10
    tolerance: float = 0.15
    max_seconds: float = 5.0


def is_stable(lat: Sequence[float], policy: WarmupPolicy) -> bool:
    """The minimum passes are done and the last two latencies agree within the tolerance."""
    return len(lat) >= max(2, policy.min_passes) and \
        abs(lat[-1] - lat[-2]) <= policy.tolerance * max(lat[-1], lat[-2])


def another_pass(lat: Sequence[float], elapsed: float, policy: WarmupPolicy) -> bool:
    """Whether to run one more pass, given the latencies of the passes done (seconds) and the seconds
    elapsed since the first began. Pure: the caller reads the clock."""
    if not lat:
        return True  # the first pass always runs: without one there is nothing warm
    if len(lat) >= max(1, policy.max_passes) or is_stable(lat, policy):
        return False
    return elapsed + lat[-1] <= policy.max_seconds  # the ceiling wins over min_passes


def run_until_stable(one_pass: Callable[[], None], policy: WarmupPolicy,
                     check_cancel: Callable[[], None] | None = None, *,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Call `one_pass` while `another_pass` says so; returns passes, stable, cut_short, latency_ms,
    first_ms (cut_short: the time ceiling stopped it before `min_passes`)."""
    lat: list[float] = []
    started = clock()
    while another_pass(lat, clock() - started, policy):
        if check_cancel is not None:
            check_cancel()
        t0 = clock()
        one_pass()
        lat.append(clock() - t0)
    stable = is_stable(lat, policy)
    cut_short = not stable and len(lat) < min(policy.min_passes, max(1, policy.max_passes))
    return {"passes": len(lat), "stable": stable, "cut_short": cut_short, "latency_ms": round(lat[-1] * 1000, 3),
            "first_ms": round(lat[0] * 1000, 3)}
