"""One model's cold start, warm request and (torch) host-tier promotion, measured in this process."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

from prewarm.catalog_entries import ModelEntry, TokenWarmupInput

NO_HOST_TIER = {
    "vllm": "none on CPU: vLLM's sleep mode (its host tier) is not supported there; on CUDA it is sleep level 1",
    "transformers": "none in prewarm yet: the host cache stages torch models only, so a transformers replica "
                    "always loads from storage",
}


# What the vLLM engine's own log says of its load (0.32's wording), to split its start -> /health.
ENGINE_LOG_FIGURES = {"weights_seconds": re.compile(r"Loading weights took ([\d.]+) seconds"),
                      "engine_init_seconds": re.compile(r"init engine \(.*?\) took ([\d.]+) s")}


def engine_log_figures(text: str) -> dict[str, float | None]:
    """The engine's own weight-load and init (profile, KV cache, compile) seconds from its log; None for
    a figure the log does not give (another vLLM version's wording)."""
    out: dict[str, float | None] = {}
    for name, rx in ENGINE_LOG_FIGURES.items():
        m = rx.search(text)
        out[name] = float(m.group(1)) if m else None
    return out


class BenchError(RuntimeError):
    """The benchmark cannot run (engine missing, replica failed); the message says why."""


def _policy() -> Any:
    from gpu_worker.runtimes.warmup import WarmupPolicy

    return WarmupPolicy()  # the worker's default: what a real preload runs


def _spec(entry: ModelEntry, device: str) -> Any:
    """The ReplicaSpec the worker would give `entry` (gpu_worker/replica_runtimes.py), on `device`."""
    from gpu_worker.runtimes import ReplicaSpec, TokenWarmup

    warm = tuple(TokenWarmup(w.prompt_tokens, w.batch) for w in entry.warmup if isinstance(w, TokenWarmupInput))
    return ReplicaSpec(model=entry.id, version=entry.version, path=entry.weights, device=device,
                       gpu=f"bench/{device}", warmup=warm or (TokenWarmup(16, 1),), policy=_policy(),
                       kv_cache_bytes=entry.kv_cache_bytes or ReplicaSpec.kv_cache_bytes, roots=entry.roots)


def _make(entry: ModelEntry, device: str, host_cache: Any = None, lora: Any = None) -> Any:
    """The runtime the worker would make for `entry` (gpu_worker/replica_runtimes.py), on `device`; `lora` (vllm):
    the engine's LoRA slots, as the worker gives a base whose catalog has adapters."""
    if entry.runtime == "torch":
        from gpu_worker.device import make_device
        from gpu_worker.runtimes.torch_module import TorchRuntime
        from prewarm.config import DeviceSpec

        dev = make_device(DeviceSpec(device, None if device.startswith("cuda") else 1 << 40), f"bench/{device}")
        staged = None
        if host_cache is not None:
            def staged(e: ModelEntry, _expected: Any) -> int | None:
                m = host_cache.get(e.key)
                return sum(t.nbytes for t in m.tensors.values()) if m is not None else None
        return TorchRuntime(entry, dev, f"bench/{device}", policy=_policy(), host_cache=host_cache,
                            staged_bytes=staged)
    spec = _spec(entry, device)
    if entry.runtime == "transformers":
        from gpu_worker.runtimes.hf import HFRuntime

        return HFRuntime(spec)
    from gpu_worker.runtimes.vllm_engine import VllmRuntime

    return VllmRuntime(spec, lora=lora)


def _request(entry: ModelEntry) -> dict[str, Any]:
    if entry.runtime == "torch":
        return {"inputs": None}  # the first declared warmup shape
    return {"prompt": "The quick brown fox", "max_tokens": 1}  # a short completion: one new token


def _cold(rt: Any) -> dict[str, float]:
    t0 = time.perf_counter()
    rt.required_bytes()
    rt.load()
    t1 = time.perf_counter()
    rt.warm()
    t2 = time.perf_counter()
    timings = getattr(rt, "timings", {})  # the vllm runtime splits its load: spawn, then /health
    process = float(timings.get("process_start_seconds", 0.0))
    return {"total_seconds": t2 - t0, "process_start_seconds": process, "weight_load_seconds": t1 - t0 - process,
            "warmup_seconds": t2 - t1}


def run_bench(entry: ModelEntry, *, device: str = "cpu", requests: int = 5,
              log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    from gpu_worker.errors import WorkerError

    if requests < 1:
        raise BenchError(f"--requests {requests} must be at least 1")
    mode = "engine process (vLLM OpenAI server), driven in-process" if entry.runtime == "vllm" else "in-process"
    primed = entry.runtime != "vllm"
    if primed:
        # A worker has imported its libraries and run its loader before: one unreported cold start first,
        # so the figures are a replica's, not this process's first use of transformers or the loader.
        log(f"{entry.key}: priming ({entry.runtime} in-process: one unreported cold start) ...")
        rt = _make(entry, device)
        try:
            _cold(rt)
        except WorkerError as exc:
            raise BenchError(str(exc)) from None
        finally:
            rt.release()
    rt = _make(entry, device)
    try:
        log(f"{entry.key}: cold start ({entry.runtime}) ...")
        cold = _cold(rt)
        held = rt.measure()
        log_path = getattr(rt, "log_path", None)
        if log_path is not None:
            try:
                text = log_path.read_text(errors="replace")
            except OSError:
                text = ""  # the figures then read None: the split is the engine's to give
            cold["engine_log"] = engine_log_figures(text)
        lat = []
        for _ in range(requests):
            t0 = time.perf_counter()
            rt.serve(_request(entry))
            lat.append(time.perf_counter() - t0)
        promotion = None
        if entry.runtime == "vllm" and rt.host_tier() is None:  # CUDA: the engine's sleep is its host tier
            promotion = _engine_promotion(rt, entry, log)
    except WorkerError as exc:
        raise BenchError(str(exc)) from None
    finally:
        rt.release()
    if entry.runtime == "torch":
        promotion = _promotion(entry, device, log)
    return {"model": entry.key, "runtime": entry.runtime, "mode": mode, "primed": primed, "device": device,
            "held_bytes": held,
            "size_bytes": entry.size_bytes, "cold_start": cold,
            "warm_request": {"p50_seconds": statistics.median(lat), "min_seconds": min(lat), "requests": requests},
            "host_promotion": promotion,
            "host_tier": promotion["tier"] if promotion else NO_HOST_TIER[entry.runtime]}


def _engine_promotion(rt: Any, entry: ModelEntry, log: Callable[[str], None]) -> dict[str, Any]:
    """vLLM on CUDA: put the warm engine to sleep (level 1), then time its wake_up and warmup (the
    promotion a preload on its GPU does)."""
    log(f"{entry.key}: engine to sleep (level 1), then wake_up ...")
    t0 = time.perf_counter()
    asleep = rt.sleep()
    t1 = time.perf_counter()
    rt.load()
    t2 = time.perf_counter()
    rt.warm()
    t3 = time.perf_counter()
    if rt.source != "host":
        raise BenchError(f"{entry.key}: the promotion came from {rt.source}, not the sleeping engine")
    return {"tier": "engine sleep (vLLM sleep level 1)", "stage_seconds": t1 - t0, "asleep_device_bytes": asleep,
            "total_seconds": t3 - t1, "weight_load_seconds": t2 - t1, "warmup_seconds": t3 - t2}


def _promotion(entry: ModelEntry, device: str, log: Callable[[str], None]) -> dict[str, float]:
    """Stage the model in a host cache of its own (as `prewarm stage` does), then time a promoted replica."""
    from gpu_worker.host_cache import HostCache

    cache = HostCache(entry.size_bytes * 2 + (64 << 20), pin=device.startswith("cuda"))
    log(f"{entry.key}: staging in host memory, then a promotion ...")
    t0 = time.perf_counter()
    cache.stage(entry.key, entry.weights, roots=entry.roots)
    stage = time.perf_counter() - t0
    rt = _make(entry, device, host_cache=cache)
    try:
        fig = _cold(rt)
        if rt.source != "host":
            raise BenchError(f"{entry.key}: the promotion read from {rt.source}, not the host cache")
    finally:
        rt.release()
        cache.evict(entry.key)
    return {"tier": "node host cache", "stage_seconds": stage, **fig}


def _engine_processes() -> set[int]:
    """The pids of this process's descendants (a vLLM engine is a process tree under it)."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def run_adapter_bench(entry: ModelEntry, base: ModelEntry, *, device: str = "cpu", requests: int = 5,
                      log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """A vllm-adapter: its base's engine started as the worker starts a base with adapters (LoRA enabled;
    timed start -> ready: base_cold_start_seconds), then the adapter loaded into that running engine and
    warmed through it (absent -> ready: adapter_load_seconds), then warm requests through the adapter.
    The processes under this one before and after the adapter's load are compared (base.processes: the
    engine's process tree then), so the report shows that loading it started no engine
    (processes_started_by_adapter_load: 0)."""
    from gpu_worker.errors import WorkerError
    from gpu_worker.runtimes.vllm_adapter import VllmAdapterRuntime
    from gpu_worker.runtimes.vllm_engine import LoraSlots

    if requests < 1:
        raise BenchError(f"--requests {requests} must be at least 1")
    if base.runtime != "vllm":
        raise BenchError(f"{entry.key}: its base {base.key} has runtime {base.runtime!r}, not vllm")
    engine = _make(base, device, lora=LoraSlots(base.max_adapters, base.max_cpu_adapters, base.max_lora_rank))
    try:
        log(f"{base.key}: base engine cold start (vllm with LoRA enabled) ...")
        base_cold = _cold(engine)
        host, pid = base.key, engine.proc.pid if engine.proc is not None else None
        rt = VllmAdapterRuntime(_spec(entry, device), engine, host)
        before = _engine_processes()
        log(f"{entry.key}: adapter load into the running {host} engine ...")
        cold = _cold(rt)
        started = _engine_processes() - before
        lat = []
        served_by = None
        for _ in range(requests):
            t0 = time.perf_counter()
            answer = rt.serve(_request(entry))
            lat.append(time.perf_counter() - t0)
            served_by = answer.get("served_model")
        held = rt.measure()
        endpoint, base_endpoint = rt.endpoint, engine.endpoint
        rt.release()
    except WorkerError as exc:
        raise BenchError(str(exc)) from None
    finally:
        engine.release()
    return {"model": entry.key, "runtime": entry.runtime, "mode": f"adapter loaded at run time into a running "
            f"{base.key} engine (vLLM OpenAI server), driven in-process", "primed": False, "device": device,
            "held_bytes": held, "size_bytes": entry.size_bytes, "cold_start": cold,
            "adapter_load_seconds": cold["total_seconds"],
            "endpoint": endpoint,
            "base": {"model": base.key, "endpoint": base_endpoint, "pid": pid, "cold_start": base_cold,
                     "processes": len(before)},
            "base_cold_start_seconds": base_cold["total_seconds"],
            "processes_started_by_adapter_load": len(started), "served_model": served_by,
            "warm_request": {"p50_seconds": statistics.median(lat), "min_seconds": min(lat), "requests": requests},
            "host_promotion": None,
            "host_tier": f"none: an adapter lives in its base's engine ({base.key}), loaded at run time"}
