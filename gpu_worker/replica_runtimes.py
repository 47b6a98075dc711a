"""The runtimes that host the replicas of one GPU (mixed into gpu_worker.residency.NodeWorker): which runtime
a catalog entry gets (torch, transformers, vllm, or an adapter inside its base's engine), infer through a
ready one, the heartbeat's check that each still lives (and its bytes measured again), the reaping of a
previous worker's engines, and their release.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpu_worker.errors import BadRequest, LoadFailed, NotResident, WorkerError
from gpu_worker.held import LocalGpu, LocalReplica, WorkerOptions
from gpu_worker.host_cache import HostCache
from gpu_worker.runtimes import ReplicaSpec, Runtime, TokenWarmup
from gpu_worker.runtimes.engine_records import EngineLeftRunning, EngineRecords
from gpu_worker.runtimes.errors import AdapterRefused
from gpu_worker.runtimes.torch_module import TorchRuntime
from gpu_worker.runtimes.warmup import WarmupPolicy
from prewarm.catalog_entries import ADAPTER_RUNTIME, ModelEntry, TokenWarmupInput
from prewarm.domain import states as rs
from prewarm.engines import DEFAULT_KV_CACHE_BYTES
from prewarm.units import format_bytes

log = logging.getLogger("prewarm.worker")

# What `infer` sends a replica when the task gives no inputs (torch: the first warmup shape).
DEFAULT_REQUESTS: dict[str, dict[str, Any]] = {"transformers": {"prompt_tokens": 16, "batch": 1},
                                               "vllm": {"prompt": "Hello", "max_tokens": 8, "temperature": 0.0},
                                               ADAPTER_RUNTIME: {"prompt": "Hello", "max_tokens": 8, "temperature": 0.0}}


class ReplicaRuntimes:
    """The runtime of each replica on a LocalGpu: chosen for a load (Lifecycle._load), served, checked and
    released."""

    options: WorkerOptions
    host_cache: HostCache
    engine_records: EngineRecords | None
    take_sleeper: Callable[[str, LocalGpu], Any]  # sleeping_engines.SleepingEngines

    def _runtime(self, g: LocalGpu, entry: ModelEntry) -> Runtime:
        """The runtime that hosts `entry` on `g` (the catalog's `runtime` field)."""
        o = self.options
        policy = WarmupPolicy(o.warmup_min_passes, o.warmup_max_passes, o.warmup_tolerance, o.warmup_max_seconds)
        if entry.runtime == "torch":
            return TorchRuntime(entry, g.device, g.id, policy=policy, host_cache=self.host_cache,
                                staged_bytes=self._staged_bytes, arena=g.arena, threads=o.load_threads)
        spec = ReplicaSpec(model=entry.id, version=entry.version, path=entry.weights,
                           device=str(g.device.torch_device), gpu=g.id,
                           warmup=tuple(TokenWarmup(w.prompt_tokens, w.batch) for w in entry.warmup
                                        if isinstance(w, TokenWarmupInput)),
                           policy=policy, kv_cache_bytes=entry.kv_cache_bytes or DEFAULT_KV_CACHE_BYTES,
                           device_total_bytes=g.device.total_bytes() if g.spec.is_cuda else None,
                           roots=entry.roots, budget=g.device)
        if entry.runtime == "transformers":
            from gpu_worker.runtimes.hf import HFRuntime

            return HFRuntime(spec, threads=o.load_threads)
        if entry.runtime == "vllm":
            from gpu_worker.runtimes.vllm_engine import VllmRuntime

            asleep = self.take_sleeper(entry.key, g)  # its engine asleep on this GPU: load() wakes it
            return asleep if asleep is not None else VllmRuntime(spec, records=self.engine_records,
                                                                 lora=self._lora_slots(entry))
        if entry.runtime == ADAPTER_RUNTIME:
            return self._adapter_runtime(g, entry, spec)
        raise LoadFailed(f"{entry.key}: unknown runtime {entry.runtime!r}")

    def _lora_slots(self, entry: ModelEntry) -> Any:
        """A vllm base's LoRA settings when the catalog has adapters for it (its engine then starts with
        LoRA enabled), else None: an engine without adapters runs as before."""
        from gpu_worker.runtimes.vllm_engine import LoraSlots

        if not self.catalog().adapters_of(entry.id):
            return None
        return LoraSlots(entry.max_adapters, entry.max_cpu_adapters, entry.max_lora_rank)

    def _adapter_runtime(self, g: LocalGpu, entry: ModelEntry, spec: ReplicaSpec) -> Runtime:
        """An adapter's runtime, inside the ready replica of its base on `g` (which its record then names as
        `host`): refused in words when there is none, or when that engine's LoRA slots are all taken by other
        adapters (loaded or loading). Decided under the GPU's lock, so two loads cannot take one last slot."""
        from gpu_worker.runtimes.vllm_adapter import VllmAdapterRuntime
        from gpu_worker.runtimes.vllm_engine import VllmRuntime

        base = entry.base or ""
        where = f"cannot load adapter {entry.key} on {g.id}"
        with g.lock:
            s = g.replicas.get(entry.key)  # this load's slot (Lifecycle._admit put it there)
            if s is None:
                raise AdapterRefused(f"{where}: its load was cancelled (evicted) before it started")
            of_base = [x for x in g.replicas.values() if x.record.model == base]
            hosts = [x for x in of_base if x.record.state == rs.READY and isinstance(x.runtime, VllmRuntime)]
            if not hosts:
                seen = ", ".join(f"{x.record.version}: {x.record.state}" for x in of_base) or "absent"
                raise AdapterRefused(f"{where}: its base {base} is not ready there ({seen}); an adapter is loaded "
                                     f"into a ready replica of its base: preload {base} on {g.id} first")
            host = max(hosts, key=lambda x: x.record.since)
            engine = host.runtime
            assert isinstance(engine, VllmRuntime)
            host_key = f"{host.record.model}@{host.record.version}"
            if engine.lora is None:
                raise AdapterRefused(f"{where}: the engine of its base {host_key} was started without LoRA (the "
                                     "catalog had no adapters for it then); evict the base and preload it again")
            taken = sorted(x.record.model for x in g.replicas.values()
                           if x is not s and x.record.host == host_key and x.record.state != rs.FAILED)
            if len(taken) >= engine.lora.max_loras:
                raise AdapterRefused(f"{where}: the engine of its base {host_key} has all its "
                                     f"{engine.lora.max_loras} LoRA slot(s) (max_adapters) taken by "
                                     f"{', '.join(taken)}; evict one of them first, or raise {base}'s max_adapters "
                                     "in the catalog")
            s.record.host = host_key
        return VllmAdapterRuntime(spec, engine, host_key)

    # --- infer ------------------------------------------------------------------------------------
    def infer(self, g: LocalGpu, model: str, inputs: Any = None, *, version: str | None = None,
              seed: int = 0) -> dict[str, Any]:
        """One request to a ready replica. torch: `inputs` None (the first warmup shape), a spec
        {"shape", "dtype", "high"}, or nested lists of numbers. transformers: None or a table
        ({"prompt", "max_tokens"}, {"input_ids"}, {"prompt_tokens", "batch"}). vllm: None or a
        /v1/completions body ({"prompt", "max_tokens", ...}), sent to the engine's endpoint."""
        with g.lock:
            cands = [s for s in g.replicas.values()
                     if s.record.model == model and (not version or s.record.version == version)]
            ready = [s for s in cands if s.record.state == rs.READY and s.runtime is not None]
            if not ready:
                seen = ", ".join(f"{s.record.version}: {s.record.state}" for s in cands) or "absent"
                raise NotResident(f"{model}{'@' + version if version else ''} is not resident on {g.id} ({seen}); "
                                  "preload it first")
            s = max(ready, key=lambda x: x.record.since)
            s.record.in_flight += 1
            rt = s.runtime
            rec = replace(s.record)
        assert rt is not None
        try:
            answer = rt.serve(_request(rt, inputs, seed))
        except WorkerError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise BadRequest(f"infer on {rec.model}@{rec.version} on {g.id} failed: {type(exc).__name__}: {exc}") \
                from None
        finally:
            with g.lock:
                s.record.in_flight -= 1
                s.record.last_used = time.time()
        return {**answer, "model": rec.model, "version": rec.version, "gpu": g.id}

    def check_runtimes(self, g: LocalGpu) -> None:
        """A ready replica whose runtime died (an engine process that exited) goes `failed` with the
        runtime's reason; its bytes and whatever of it is left are released. A live engine's bytes are
        measured again (every remeasure_seconds). Called with every heartbeat."""
        with g.lock:
            ready = [(k, s) for k, s in g.replicas.items() if s.record.state == rs.READY and s.runtime is not None]
        for k, s in ready:
            assert s.runtime is not None
            why = s.runtime.died()
            if why is None:
                self._remeasure(g, k, s)
                continue
            with g.lock:
                if g.replicas.get(k) is not s or s.runtime is None:
                    continue  # evicted meanwhile
                rt, s.runtime = s.runtime, None
                s.record.state, s.record.error, s.record.since = rs.FAILED, why, time.time()
                s.record.bytes, s.record.progress, s.record.endpoint = 0, 0.0, None
            left = release_runtime(rt)
            freed = g.device.release(k)
            g.device.reclaim()
            self.publish(g, s)
            self._event("failed", s.record.model, g, why, {"version": s.record.version, "bytes_freed": freed,
                                                          "runtime": rt.name, "while": "ready"})
            log.error("%s on %s died while ready: %s%s", k, g.id, why, f" ({left})" if left else "")

    def _remeasure(self, g: LocalGpu, k: str, s: LocalReplica) -> None:
        """A ready engine's bytes measured again when its last figure is older than its runtime's
        `remeasure_seconds`: the replica record (published by this heartbeat) and the device's accounting
        show what it holds now. One that grew past the device's budget is said in the log."""
        rt = s.runtime
        every = getattr(rt, "remeasure_seconds", None)
        if rt is None or every is None or time.monotonic() - getattr(rt, "measured_at", 0.0) < every:
            return
        try:
            now = rt.measure()
        except Exception as exc:  # noqa: BLE001 - a failed measure keeps the last figure
            log.warning("re-measuring %s on %s failed: %s", k, g.id, exc)
            return
        with g.lock:
            if g.replicas.get(k) is not s or s.record.state != rs.READY or now == s.record.bytes:
                return
            s.record.bytes = now
        if not g.device.remeasured(k, now):
            log.warning("%s on %s now holds %s, past %s's budget (%s in use)", k, g.id, format_bytes(now), g.id,
                        format_bytes(g.device.inventory().used_bytes))

    def reap_engines(self, g: LocalGpu) -> None:
        """Stop every engine a previous worker recorded for `g` and left running (a SIGKILLed worker whose
        launcher could not take its engine down). Called once the GPU is claimed, before it is announced:
        an engine that survives means the GPU's memory is not free, so the GPU is not announced at all."""
        if self.engine_records is None:
            return
        for rec, line in self.engine_records.reap(g.id):
            log.warning("%s: a previous worker's %s", g.id, line)
            self._event("reaped", rec.model, g, f"a previous worker's {line}", {"version": rec.version,
                                                                                "port": rec.port})
        left = self.engine_records.records(g.id)  # kept: their processes survived SIGKILL
        if left:
            raise EngineLeftRunning(
                f"GPU {g.id}: a previous worker's engine(s) {', '.join(r.engine_id for r in left)} could not be "
                f"stopped, so its memory is not free (records under {self.engine_records.root}); stop those "
                "processes, then start the worker again")

    def release_runtimes(self, g: LocalGpu) -> None:
        """Let every replica's runtime go (worker shutdown): engines stop, no process is left behind."""
        with g.lock:
            held = [(k, s.runtime) for k, s in g.replicas.items() if s.runtime is not None]
            for s in g.replicas.values():
                s.runtime = None
        for k, rt in held:
            left = release_runtime(rt)
            if left:
                log.error("shutdown: releasing %s on %s: %s", k, g.id, left)
            g.device.release(k)


def _request(rt: Runtime, inputs: Any, seed: int) -> dict[str, Any]:
    """The runtime's request for an `infer` task's inputs."""
    if rt.name == "torch":
        return {"inputs": inputs, "seed": seed}
    if inputs is None:
        return dict(DEFAULT_REQUESTS.get(rt.name, {}))
    if not isinstance(inputs, dict):
        raise BadRequest(f"a {rt.name} replica takes a request table, e.g. {DEFAULT_REQUESTS.get(rt.name, {})}, "
                         f"not {type(inputs).__name__}")
    return inputs


def release_runtime(rt: Runtime | None) -> str:
    """Release a runtime; '' when nothing of it is left, else what is (ReleaseFailed's message)."""
    if rt is None:
        return ""
    try:
        rt.release()
    except Exception as exc:  # noqa: BLE001 - what is left is reported; the caller's outcome stands
        return f"{type(exc).__name__}: {exc}"
    return ""
