"""Prometheus metrics of prewarm as the web exposes them (names and units: docs/metrics.md).

Metric definitions other processes share live in prewarm/metrics_defs.py (the scheduler observes its tick
there without importing web). Two kinds of metric:
- In-process counters (route lookups, cold starts) and the scheduler's tick histogram. Under gunicorn,
  PROMETHEUS_MULTIPROC_DIR must be set before prometheus_client is imported (`prewarm web` does it);
  `/metrics` then sums every worker process's files.
- Values that live in Redis, read at scrape time by `RedisCollector`: request totals per model (exact
  across processes and restarts), preloads/evictions per reason (counted by every dispatcher), GPU
  memory split into ready / loading / free, and the histograms of events observed where they happen
  (cold-start duration, model load and warmup: the worker records them when a replica turns ready).
  Reading Redis at scrape time means no process has to keep a gauge in sync, and multiprocess mode needs
  no aggregation. A scrape only reads: whoever scrapes, and how often, changes no figure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from prewarm import metrics_defs, state, traffic
from prewarm.domain import states as rs
from prewarm.store import dispatch_counts, histograms

ROUTE_LOOKUPS = Counter("prewarm_route_lookups", "Route hook lookups by what the router was told: "
                        "ready (a warm hit), loading or cold", ["result"])
COLD_STARTS = Counter("prewarm_cold_starts", "Cold starts: a route lookup found no ready replica of "
                      "the model (counted once per episode, until a replica is ready)", ["model"])
FALLBACK_OFFERS = Counter("prewarm_route_fallbacks", "Route lookups of a loading or cold model answered with "
                          "ready replicas of its catalog fallback (the router may serve the request there)",
                          ["model", "fallback"])
# Made here at import, so every gunicorn worker's file shows them (zeros) before a scheduler observes any.
SCHEDULER_TICK = metrics_defs.in_process(metrics_defs.SCHEDULER_TICK)
SCHEDULER = tuple(metrics_defs.in_process(d) for d in metrics_defs.SCHEDULER_HISTOGRAMS)
for _part in metrics_defs.TICK_PARTS:
    metrics_defs.in_process(metrics_defs.SCHEDULER_TICK_PART).labels(_part)
SCHEDULER_PLAN_FAILURES = metrics_defs.in_process_counter(metrics_defs.SCHEDULER_PLAN_FAILURES)
SCHEDULER_PLAN_FAILURES.labels("")  # zero: no failed plan yet
for _result in rs.ROUTE_STATES:
    ROUTE_LOOKUPS.labels(_result)  # export zeros so the hit-rate ratio exists before the first lookup


class RedisCollector(Collector):
    """Metrics whose truth is in Redis, read at scrape time (a few pipelined reads, any model count)."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("prewarm_requests", "Requests reported by the router through "
                                       "/hooks/requests", labels=["model"])
        for model, n in sorted(traffic.totals(self.r).items()):
            requests.add_metric([model], n)
        yield requests

        preloads = CounterMetricFamily("prewarm_preloads", "Preloads dispatched, by reason (demand, "
                                       "speculative, operator, rollout, ...)", labels=["reason"])
        evictions = CounterMetricFamily("prewarm_evictions", "Evictions dispatched, by reason",
                                        labels=["reason"])
        stages = CounterMetricFamily("prewarm_stages", "Stages into a node's host cache dispatched, by reason",
                                     labels=["reason"])
        unstages = CounterMetricFamily("prewarm_unstages", "Unstages from a node's host cache dispatched, by "
                                       "reason", labels=["reason"])
        families = {"preload": preloads, "evict": evictions, "stage": stages, "unstage": unstages}
        for (action, reason), n in dispatch_counts.read(self.r).items():
            family = families.get(action)
            if family is not None:
                family.add_metric([reason], n)
        yield from families.values()

        counts = histograms.read(self.r, metrics_defs.REDIS_HISTOGRAMS)
        for d in metrics_defs.REDIS_HISTOGRAMS:
            h = counts[d.name]
            yield HistogramMetricFamily(d.name, d.help, buckets=[(floatToGoString(b), n) for b, n in h.buckets],
                                        sum_value=h.sum)

        memory = GaugeMetricFamily("prewarm_gpu_memory_bytes", "GPU memory by use: held by ready "
                                   "replicas, by replicas still loading, and free (worker-measured)",
                                   labels=["gpu", "kind"])
        alive = GaugeMetricFamily("prewarm_gpu_up", "1 while the GPU's worker heartbeats, 0 once stale",
                                  labels=["gpu"])
        host = GaugeMetricFamily("prewarm_host_cache_bytes", "Node host cache (staging tier) memory by use: "
                                 "held by staged models, reserved by stages in progress, and free",
                                 labels=["node", "kind"])
        fleet = state.read_fleet(self.r)
        for g in fleet.gpus:
            alive.add_metric([g.id], 1.0 if g.alive else 0.0)
            if not g.alive:
                continue
            split = memory_split(g)
            for kind, v in split.items():
                memory.add_metric([g.id, kind], float(v))
        draining = GaugeMetricFamily("prewarm_node_draining", "1 while the node is draining (no new preloads; its "
                                     "replicas move elsewhere before its worker exits), else 0", labels=["node"])
        for name in sorted({g.node for g in fleet.alive()} | set(fleet.drain_records)):
            d = fleet.drain_records.get(name)
            draining.add_metric([name], 1.0 if d is not None and d.draining else 0.0)
        for n in fleet.nodes:
            staged = sum(x.bytes for x in n.staged if x.state == rs.STAGED)
            for kind, v in (("staged", staged), ("staging", max(0, n.used_bytes - staged)), ("free", n.free_bytes)):
                host.add_metric([n.node, kind], float(v))
        yield memory
        yield alive
        yield host
        yield draining


MEMORY_KINDS = ("ready", "loading", "evicting", "free")


def memory_split(g: state.Gpu) -> dict[str, int]:
    """Bytes held by ready replicas, by replicas on their way in (pending/loading/warming), by replicas
    leaving (evicting), and free: MEMORY_KINDS, in that order."""
    def held(states: tuple[str, ...]) -> int:
        return sum(x.bytes for x in g.replicas if x.state in states)

    return {"ready": held((rs.READY,)), "loading": held(rs.IN_FLIGHT),
            "evicting": held((rs.EVICTING,)), "free": g.free_bytes}


def exposition(r: redis.Redis) -> bytes:
    """The text exposition: this process's (or every gunicorn worker's) metrics plus Redis-backed ones."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        for collector in (ROUTE_LOOKUPS, COLD_STARTS, FALLBACK_OFFERS, *SCHEDULER, SCHEDULER_PLAN_FAILURES):
            registry.register(collector)
    registry.register(RedisCollector(r))
    return generate_latest(registry)

