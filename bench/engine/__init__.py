"""`prewarm bench engine MODEL`: a replica's cold start against a warm request, for each runtime.

The runtime runs in this process exactly as the worker drives it (gpu_worker/runtimes: required_bytes,
load, warm, serve, release) — no Redis, no Celery worker: the figures are the runtime's own, without the
task queue's delivery. For `vllm` the replica is still the real engine server process the worker starts.

Cold start = start -> ready, split into process start (the engine process spawned; 0 for torch and
transformers, which run inside the worker), weight load (weights to the device; for vllm the engine's
own load and initialisation until /health answers) and warmup (every declared entry until its latency
is stable). A warm request is one `serve` on the ready replica (median of a few). The in-process runtimes are
primed first (one unreported cold start: a worker has imported transformers and run its loader before
its next load); a vllm cold start is always a fresh engine process, so it is not primed. For `torch` the host
tier is measured too: the model staged in a node host cache, then a replica promoted from it. `vllm`
has no host tier on CPU (its sleep mode is not supported there); `transformers` has none in prewarm.

For a LoRA adapter (`vllm-adapter`) it starts the base's engine with LoRA enabled (timed start -> ready:
base_cold_start_seconds), then loads the adapter into that running engine (absent -> ready:
adapter_load_seconds), then warm requests through it; processes_started_by_adapter_load says whether the
load started any process (0: no second engine). run.run_adapter_bench; docs/worker.md gives the figures.

Its parts: run (the measurement), cli (`prewarm bench engine`). It reports; it asserts nothing.
"""

from __future__ import annotations

from .cli import cmd_bench_engine, register

__all__ = ["cmd_bench_engine", "register"]
