"""Metric definitions more than one process shares (names, help, buckets: docs/metrics.md).

Plain data, so the worker and the store import them without prometheus_client: the histograms of events
that happen in the worker (a model turning ready) are kept in Redis by prewarm.store.histograms and
exposed by the web's RedisCollector under these names. A process that observes one of them in its own
memory (the scheduler's tick) makes its prometheus_client object with `in_process`, created once per
process whoever asks (the web registers the same object for its exposition).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram


@dataclass(frozen=True)
class HistogramDef:
    name: str
    help: str
    buckets: tuple[float, ...]  # upper bounds, ascending, without +Inf (every histogram has that one too)
    labels: tuple[str, ...] = ()

    def bucket_of(self, value: float) -> float:
        """The bound of the bucket a value is counted in: the first bound >= value (Prometheus's `le`)."""
        return next((b for b in self.buckets if value <= b), math.inf)

    def bounds(self) -> tuple[float, ...]:
        return (*self.buckets, math.inf)

    def quantile_bound(self, counts: Mapping[float, int], q: float) -> float | None:
        """The bound of the bucket holding the q-quantile of events counted per bucket bound (as
        `bucket_of` gives them), an upper bound of it; None when nothing was counted."""
        n = sum(counts.values())
        if not n:
            return None
        running = 0
        for bound in sorted(counts):
            running += counts[bound]
            if running >= q * n:
                return bound
        return math.inf


# Cold starts run from seconds (a small model from page cache) to minutes (a large one from storage).
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

# Kept in Redis (observed where the event happens, exposed by every web process alike).
COLD_START_DURATION = HistogramDef("prewarm_cold_start_duration_seconds", "Time from a route lookup seeing a "
                                   "model cold to a replica of it being ready", LOAD_BUCKETS)
MODEL_LOAD = HistogramDef("prewarm_model_load_seconds", "Time to read a model's weights onto its device",
                          LOAD_BUCKETS)
MODEL_WARMUP = HistogramDef("prewarm_model_warmup_seconds", "Time to run a model's warmup inputs after loading",
                            LOAD_BUCKETS)
# real − promised seconds to ready: negative when the model was ready sooner than the route hook said
ETA_ERROR = HistogramDef("prewarm_route_eta_error_seconds", "Real minus promised time to ready of the first "
                         "ETA a route lookup gave for a loading or cold model (negative: ready sooner)",
                         (-60.0, -30.0, -10.0, -5.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
                          60.0, 120.0))
REDIS_HISTOGRAMS = (COLD_START_DURATION, MODEL_LOAD, MODEL_WARMUP, ETA_ERROR)

# Observed in the scheduler's process (its own port, or the multiprocess folder `prewarm up` shares).
TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SCHEDULER_TICK = HistogramDef("prewarm_scheduler_tick_seconds", "Duration of one scheduler tick: snapshot, "
                              "plan and dispatch", TICK_BUCKETS)
TICK_PARTS = ("snapshot", "plan", "dispatch")  # the values of SCHEDULER_TICK_PART's `part` label
SCHEDULER_TICK_PART = HistogramDef("prewarm_scheduler_tick_part_seconds", "Duration of one part of a scheduler "
                                   "tick: snapshot (the Redis reads), plan (the pure policy), dispatch (intents "
                                   "and task sends)", TICK_BUCKETS, labels=("part",))
SCHEDULER_ROUND_TRIPS = HistogramDef("prewarm_scheduler_redis_round_trips", "Redis round trips of one scheduler "
                                     "tick on prewarm's own connection (a pipeline counts once)",
                                     (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
SCHEDULER_PLAN_ACTIONS = HistogramDef("prewarm_scheduler_plan_actions", "Actions one scheduler tick's plan "
                                      "returned (before dispatch refuses any already in flight)",
                                      (0, 1, 2, 5, 10, 20, 50, 100, 200, 500))
SCHEDULER_HISTOGRAMS = (SCHEDULER_TICK, SCHEDULER_TICK_PART, SCHEDULER_ROUND_TRIPS, SCHEDULER_PLAN_ACTIONS)


@dataclass(frozen=True)
class CounterDef:
    name: str  # without `_total`: prometheus_client adds it in the exposition
    help: str
    labels: tuple[str, ...] = ()


SCHEDULER_PLAN_FAILURES = CounterDef("prewarm_scheduler_plan_failures", "Scheduler plans that raised, by the "
                                     "model the fault was put on (left out of the plan until its spec changes; "
                                     "the other models are planned); model=\"\" when no one model explains it "
                                     "(that tick planned nothing)", labels=("model",))


@functools.cache
def in_process(d: HistogramDef) -> Histogram:
    """The prometheus_client histogram for `d` in this process (made on first use, registered once)."""
    from prometheus_client import Histogram

    return Histogram(d.name, d.help, labelnames=d.labels, buckets=d.buckets)


@functools.cache
def in_process_counter(d: CounterDef) -> Counter:
    """The prometheus_client counter for `d` in this process (made on first use, registered once)."""
    from prometheus_client import Counter

    return Counter(d.name, d.help, labelnames=d.labels)
