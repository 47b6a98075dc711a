"""`prewarm bench tick`: the live scheduler's tick against a real Redis filled like a large fleet.

It fills an empty Redis (an embedded one when PREWARM_REDIS_URL is unset) the way the running system
would, through prewarm's own writers: a catalog of `--models` real safetensors files (sparse, so 10,000
models of many GiB take no disk), `--gpus` GPUs of `--gpu-memory` (8 per node) whose heartbeats carry
ready replicas filling their memory, the measured load times of those replicas (prewarm.store.ready, as a
worker records a load), and an hour of traffic with Zipf(`--zipf`) popularity at `--rate` requests/s in
all (prewarm.traffic.record, per-second timestamps). Then it runs `--ticks` ticks of the live scheduler
(scheduler.live.Scheduler.tick: snapshot read, plan, dispatch into the real Celery broker with no worker
consuming), one every `--interval` seconds (the scheduler's tick period), while new traffic arrives, the
GPUs heartbeat and a few loads elsewhere are measured between ticks.

It prints the first tick (a scheduler that just took the lead: history read from the per-minute buckets,
every record read) and p50/p95 of the later ticks, whole and per part. It reports; it asserts nothing.

Its parts: fleet (what it writes before the ticks), run (the ticks, timed), cli (`prewarm bench tick`).
"""

from __future__ import annotations

from .cli import cmd_bench_tick, register
from .run import run_bench

__all__ = ["cmd_bench_tick", "register", "run_bench"]
