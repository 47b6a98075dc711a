"""vLLM's host tier on CUDA (mixed into gpu_worker.residency.NodeWorker): a staged vllm model is a sleeping
engine.

Where a torch model's host tier is a copy of its weights in the node's host cache, a vllm model's is its
engine put to sleep level 1 (runtimes/vllm_engine.py: weights copied to host memory, KV cache dropped, the
process, port and CUDA context kept). So:

- `stage` of a vllm model takes a ready replica of it on this node off its GPU (no longer routable) and
  puts its engine to sleep; the GPU keeps accounting only what the sleeping engine still holds there
  (measured). It cannot stage from storage (an engine asleep is an engine started first), and on CPU it is
  refused: vLLM has no sleep mode there (NO_HOST_TIER_CPU).
- a `preload` of that model on the same GPU is a promotion: the sleeping engine's runtime is handed to the
  lifecycle, whose load() is POST /wake_up (`source` "host"), then warm and ready as after a cold start. A
  preload on another GPU starts a fresh engine (the sleeping one is bound to its device).
- `unstage` (and shutdown) stops the sleeping engine; the heartbeat drops one whose process died.

Sleeping engines are published with the node's staged models (state "staged", `reason` naming the GPU).
Their host bytes are vLLM's, outside the host cache's budget.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from gpu_worker.errors import LoadFailed
from gpu_worker.held import LocalGpu, LocalReplica
from prewarm import state
from prewarm.catalog_entries import ModelEntry
from prewarm.domain import states as rs
from prewarm.units import format_bytes

log = logging.getLogger("prewarm.worker")

DRAIN_SECONDS = 10.0  # how long a stage waits for requests in flight on the replica it puts to sleep
NO_STAGE_FROM_STORAGE = ("vLLM's host tier is a sleeping engine (sleep level 1): a vllm model is staged by "
                         "putting a ready replica of it to sleep, and none is ready on this node")


@dataclass
class Sleeper:
    gpu: str
    runtime: Any  # a VllmRuntime, asleep
    record: state.Staged

    @property
    def device_key(self) -> str:
        return f"{self.record.model}@{self.record.version}#asleep"


class SleepingEngines:
    """stage / promote / unstage of sleeping vLLM engines; see the module docstring."""

    node: str
    gpus: dict[str, LocalGpu]
    _sleep_lock: threading.Lock
    _sleepers: dict[str, Sleeper]
    evict: Any  # lifecycle.Lifecycle.evict: a base's adapters are unloaded before it sleeps

    # Publication's _write_node, _release_intent, _node_event, _drop_published and _cache_figures are
    # used here.

    def stage_engine(self, entry: ModelEntry, *, reason: str, kind: str, value: float,
                     intent_id: str) -> dict[str, Any]:
        """Put a ready replica of the vllm model `entry` on this node to sleep; see the module docstring."""
        key, target = entry.key, state.host_id(self.node)
        try:
            with self._sleep_lock:
                if key in self._sleepers:
                    sl = self._sleepers[key]
                    sl.record.value = max(sl.record.value, float(value))
                    return self._sleep_result(sl, noop=True)
            g, k, s = self._ready_replica(entry)
            sl = self._put_to_sleep(g, k, s, entry, reason, value)
        except LoadFailed as exc:
            self._node_event("failed", entry.id, str(exc), {"version": entry.version, "action": "stage"})
            raise
        finally:
            self._release_intent(entry.id, target, intent_id)
        self._write_node()
        self._node_event("staged", entry.id, f"put {key}'s engine on {sl.gpu} to sleep (level 1: weights to host)",
                         {"version": entry.version, "bytes": sl.record.bytes, "stage_seconds": sl.record.stage_seconds,
                          "gpu": sl.gpu, "kind": kind, "reason": reason, "tier": "engine sleep"})
        return self._sleep_result(sl, noop=False)

    def _ready_replica(self, entry: ModelEntry) -> tuple[LocalGpu, str, LocalReplica]:
        found, why = None, NO_STAGE_FROM_STORAGE
        for g in self.gpus.values():
            with g.lock:
                s = g.replicas.get(entry.key)
                if s is None or s.record.state != rs.READY or s.runtime is None:
                    continue
                rt = s.runtime
            cannot = rt.host_tier() if hasattr(rt, "host_tier") else "its runtime has no host tier"
            if cannot is None:
                found = (g, entry.key, s)
                break
            why = cannot
        if found is None:
            if all(not g.spec.is_cuda for g in self.gpus.values()):
                from gpu_worker.runtimes.vllm_engine import NO_HOST_TIER_CPU

                why = NO_HOST_TIER_CPU
            raise LoadFailed(f"staging {entry.key} on node {self.node}: {why}")
        return found

    def _put_to_sleep(self, g: LocalGpu, k: str, s: LocalReplica, entry: ModelEntry, reason: str, value: float) -> Sleeper:
        # Its LoRA adapters live in the engine being put to sleep: unloaded first, each with its evict event.
        with g.lock:
            hosted = sorted({x.record.model for x in g.replicas.values() if x.record.host == k})
        for adapter in hosted:
            self.evict(g, adapter, reason=f"its base {k} is put to sleep on {g.id} (staged: {reason or 'stage'})")
        with g.lock:
            if g.replicas.get(k) is not s or s.record.state != rs.READY:
                raise LoadFailed(f"staging {k} on node {self.node}: its replica on {g.id} changed meanwhile")
            s.record.state, s.record.since = rs.EVICTING, time.time()  # no new request picks it
        deadline = time.monotonic() + DRAIN_SECONDS
        while s.record.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        with g.lock:
            del g.replicas[k]
            rt, s.runtime = s.runtime, None
        self._drop_published(g, s.record.model, s.record.version)
        t0 = time.perf_counter()
        try:
            residual = rt.sleep()
        except Exception as exc:  # noqa: BLE001 - an engine whose sleep failed is stopped, its bytes freed
            try:
                rt.release()
            except Exception as left:  # noqa: BLE001
                log.error("stopping %s after its failed sleep: %s", k, left)
            g.device.release(k)
            g.device.reclaim()
            raise LoadFailed(f"staging {k} on node {self.node}: sleep of its engine on {g.id} failed ({exc}); "
                             "the engine was stopped") from None
        g.device.release(k)
        sl = Sleeper(g.id, rt, state.Staged(
            model=entry.id, version=entry.version, node=self.node, state=rs.STAGED, bytes=rt.weights_bytes,
            total_bytes=rt.weights_bytes, progress=1.0, value=float(value), staged_at=time.time(),
            stage_seconds=round(time.perf_counter() - t0, 4),
            reason=f"engine asleep on {g.id} (vLLM sleep level 1; promotes there only)"
                   + (f"; {reason}" if reason else "")))
        g.device.reserve(sl.device_key, residual)
        g.device.commit_measured(sl.device_key, residual)
        with self._sleep_lock:
            self._sleepers[k] = sl
        log.info("%s on %s asleep: %s left on the GPU, %s of weights in host memory", k, g.id,
                 format_bytes(residual), format_bytes(rt.weights_bytes))
        return sl

    def _sleep_result(self, sl: Sleeper, *, noop: bool) -> dict[str, Any]:
        r = sl.record
        return {"model": r.model, "version": r.version, "node": self.node, "state": rs.STAGED, "bytes": r.bytes,
                "stage_seconds": r.stage_seconds, "value": r.value, "pinned": False, "noop": noop, "evicted": [],
                "gpu": sl.gpu, "tier": "engine sleep", "host_cache": self._cache_figures()}

    def take_sleeper(self, key: str, g: LocalGpu) -> Any | None:
        """The sleeping engine of `key` on `g`, handed over to a preload (its load() wakes it), or None."""
        with self._sleep_lock:
            sl = self._sleepers.get(key)
            if sl is None or sl.gpu != g.id:
                return None
            del self._sleepers[key]
        g.device.release(sl.device_key)
        self._write_node()
        return sl.runtime

    def drop_sleepers(self, model: str, version: str | None = None, reason: str = "") -> tuple[list[str], int]:
        """Stop the sleeping engines of `model` (every version unless `version`); returns versions, bytes."""
        with self._sleep_lock:
            gone = [self._sleepers.pop(k) for k, sl in list(self._sleepers.items())
                    if sl.record.model == model and (not version or sl.record.version == version)]
        freed = 0
        for sl in gone:
            self._stop(sl, reason or "unstaged")
            freed += sl.record.bytes
        return sorted(sl.record.version for sl in gone), freed

    def sleeping_records(self) -> list[state.Staged]:
        with self._sleep_lock:
            return [replace(sl.record) for sl in self._sleepers.values()]

    def check_sleepers(self) -> None:
        """A sleeping engine whose process exited is dropped (the heartbeat asks)."""
        with self._sleep_lock:
            dead = [(k, sl, why) for k, sl in self._sleepers.items() if (why := sl.runtime.died()) is not None]
            for k, _, _ in dead:
                del self._sleepers[k]
        for _, sl, why in dead:
            self._stop(sl, why)
            self._node_event("unstaged", sl.record.model, f"sleeping engine died: {why}",
                             {"version": sl.record.version, "gpu": sl.gpu})
        if dead:
            self._write_node()

    def stop_sleepers(self) -> None:
        """Shutdown: every sleeping engine stops with its worker."""
        with self._sleep_lock:
            gone, self._sleepers = list(self._sleepers.values()), {}
        for sl in gone:
            self._stop(sl, "worker shutting down")

    def _stop(self, sl: Sleeper, why: str) -> None:
        try:
            sl.runtime.release()
        except Exception as exc:  # noqa: BLE001 - what is left is reported
            log.error("stopping the sleeping engine of %s@%s on %s (%s): %s", sl.record.model, sl.record.version,
                      sl.gpu, why, exc)
        g = self.gpus.get(sl.gpu)
        if g is not None:
            g.device.release(sl.device_key)
            g.device.reclaim()
