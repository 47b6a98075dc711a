"""Prometheus metrics of prewarm (names and units: docs/metrics.md).

This module imports only prometheus_client and prewarm's torch-free core, so the scheduler and the GPU
worker can import the metric objects they observe (`SCHEDULER_TICK`, `MODEL_LOAD`, `MODEL_WARMUP`) from
here and expose them on their own port with `prometheus_client.start_http_server`.

Two kinds of metric:
- In-process counters and histograms (route lookups, cold starts, load times...). Under gunicorn,
  PROMETHEUS_MULTIPROC_DIR must be set before prometheus_client is imported (`prewarm web` does it);
  `/metrics` then sums every worker process's files.
- Values that live in Redis, read at scrape time by `RedisCollector`: request totals per model (exact
  across processes and restarts), preloads/evictions per reason (counted by every dispatcher), and GPU
  memory split into ready / loading / free. Reading Redis at scrape time means no process has to keep
  a gauge in sync, and multiprocess mode needs no gauge aggregation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prewarm import keys, state, traffic

# Cold starts run from seconds (a small model from page cache) to minutes (a large one from storage).
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

ROUTE_LOOKUPS = Counter("prewarm_route_lookups", "Route hook lookups by what the router was told: "
                        "ready (a warm hit), loading or cold", ["result"])
COLD_STARTS = Counter("prewarm_cold_starts", "Cold starts: a route lookup found no ready replica of "
                      "the model (counted once per episode, until a replica is ready)", ["model"])
COLD_START_DURATION = Histogram("prewarm_cold_start_duration_seconds", "Time from a route lookup seeing "
                                "a model cold to a replica of it being ready", buckets=_LOAD_BUCKETS)
MODEL_LOAD = Histogram("prewarm_model_load_seconds", "Time to read a model's weights onto its device",
                       buckets=_LOAD_BUCKETS)
MODEL_WARMUP = Histogram("prewarm_model_warmup_seconds", "Time to run a model's warmup inputs after "
                         "loading", buckets=_LOAD_BUCKETS)
SCHEDULER_TICK = Histogram("prewarm_scheduler_tick_seconds", "Duration of one scheduler tick: snapshot, "
                           "plan and dispatch", buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                                                         2.5, 5.0))
for _result in ("ready", "loading", "cold"):
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
        for field, n in sorted(self.r.hgetall(keys.DISPATCH_COUNTS).items()):
            action, _, reason = field.decode().partition(":")
            family = families.get(action)
            if family is not None:
                family.add_metric([reason or "unspecified"], int(n))
        yield from families.values()

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
            for kind in ("ready", "loading", "free"):
                memory.add_metric([g.id, kind], float(split[kind]))
        for n in fleet.nodes:
            staged = sum(x.bytes for x in n.staged if x.state == "staged")
            for kind, v in (("staged", staged), ("staging", max(0, n.used_bytes - staged)), ("free", n.free_bytes)):
                host.add_metric([n.node, kind], float(v))
        yield memory
        yield alive
        yield host


def memory_split(g: state.Gpu) -> dict[str, int]:
    """Bytes held by ready replicas, by replicas on their way (pending/loading/warming) or leaving, free."""
    ready = sum(x.bytes for x in g.replicas if x.state == "ready")
    loading = sum(x.bytes for x in g.replicas if x.state in ("pending", "loading", "warming", "evicting"))
    return {"ready": ready, "loading": loading, "free": g.free_bytes}


def exposition(r: redis.Redis) -> bytes:
    """The text exposition: this process's (or every gunicorn worker's) metrics plus Redis-backed ones."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        for collector in (ROUTE_LOOKUPS, COLD_STARTS, COLD_START_DURATION, MODEL_LOAD, MODEL_WARMUP,
                          SCHEDULER_TICK):
            registry.register(collector)
    registry.register(RedisCollector(r))
    return generate_latest(registry)

