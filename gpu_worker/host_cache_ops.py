"""The node's host cache operations (mixed into gpu_worker.residency.NodeWorker): stage reads a model's
weights into host memory, unstage drops them; a preload promotes a staged copy that still matches.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import redis
import torch

from gpu_worker.device import trim_host_memory
from gpu_worker.errors import (
    Cancelled,
    DoesNotFit,
    LoadFailed,
    UnknownModel,
    WorkerError,
)
from gpu_worker.held import StageJob, WorkerOptions
from gpu_worker.host_cache import HostCache, HostCacheFull
from gpu_worker.runtimes.torch_module import _meta_module
from gpu_worker.stage_book import StageBook
from prewarm import state
from prewarm.catalog_entries import ModelEntry
from prewarm.domain import states as rs
from prewarm.safetensors_header import SafetensorsError, weight_files
from prewarm.units import format_bytes

log = logging.getLogger("prewarm.worker")


class HostCacheOps:
    """stage / unstage and the promotion check; the cache itself is gpu_worker.host_cache.HostCache."""

    r: redis.Redis
    node: str
    options: WorkerOptions
    host_cache: HostCache
    stages: StageBook
    stage_engine: Any  # sleeping_engines.SleepingEngines
    drop_sleepers: Any

    def _staged_bytes(self, entry: ModelEntry, expected: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> int | None:
        """The data bytes of the model's staged copy when it can be promoted, else None. A copy that no longer
        matches the module (the builder changed) or whose weight files changed since is unstaged."""
        key = entry.key
        e = self.host_cache.get(key)
        tensors = dict(e.tensors) if e is not None else {}
        if not tensors:
            return None
        wrong = [n for n, (dtype, shape) in expected.items()
                 if n not in tensors or tensors[n].dtype != dtype or tuple(tensors[n].shape) != tuple(shape)]
        wrong += [n for n in tensors if n not in expected]
        files = self.stages.files(key)
        now = _fingerprint(entry.weights) if files else None
        why = f"does not match its module (e.g. {wrong[0]!r})" if wrong else \
            "is older than its weight files (changed since staged)" if now is not None and now != files else ""
        if why:
            log.warning("staged copy of %s %s: unstaged, loading from storage", key, why)
            self.host_cache.evict(key)
            self.stages.forget([key])
            self._write_node()
            self._node_event("unstaged", entry.id, f"staged copy {why}", {"version": entry.version})
            return None
        return sum(t.numel() * t.element_size() for t in tensors.values())


    def stage(self, model: str, version: str | None = None, *, reason: str = "", kind: str = "",
              value: float = 0.0, intent_id: str = "") -> dict[str, Any]:
        """Read `model`'s weights into the node's host cache (no device memory); idempotent.

        `value` is the keep-value the cache's value-per-byte eviction compares (a re-stage keeps the larger).
        Room is made by evicting staged models worth less per byte; when that cannot make room, DoesNotFit.
        A failure (bad file, mismatch with the module) leaves nothing staged and raises LoadFailed."""
        target = state.host_id(self.node)
        try:
            entry = self.entry(model, version)
        except UnknownModel as exc:
            self._release_intent(model, target, intent_id)
            self._node_event("failed", model, str(exc), {"version": version, "action": "stage"})
            raise
        key = entry.key
        if entry.runtime == "vllm":
            # vLLM's host tier is its engine asleep (CUDA only): sleeping_engines.py, not the host cache.
            return self.stage_engine(entry, reason=reason, kind=kind, value=value, intent_id=intent_id)
        if entry.runtime != "torch":
            # The host tier holds torch state dicts; transformers models have none in prewarm.
            msg = (f"staging {key} on node {self.node}: runtime {entry.runtime!r} has no host tier here; only "
                   "torch models are staged in the host cache")
            self._release_intent(entry.id, target, intent_id)
            self._node_event("failed", entry.id, msg, {"version": entry.version, "action": "stage"})
            raise LoadFailed(msg)
        files = self.stages.files(key)
        if files and self.host_cache.get(key) is not None and (now := _fingerprint(entry.weights)) is not None \
                and now != files:
            # Its files changed since it was staged: this stage replaces the stale copy.
            self.host_cache.evict(key)
            self._node_event("unstaged", entry.id, "staged copy is older than its weight files (changed since "
                             "staged); staging again", {"version": entry.version})
        if self.host_cache.get(key) is not None:
            return self._staged_result(entry, key, reason, kind, value, noop=True, evicted=[], intent_id=intent_id)
        job, owner = self.stages.claim(key, lambda: StageJob(state.Staged(
            model=entry.id, version=entry.version, node=self.node, state=rs.STAGING, total_bytes=entry.size_bytes,
            value=float(value), staged_at=time.time(), reason=reason or None)))
        if not owner:
            job.done.wait()  # a stage of it is running: its outcome is this one's
            if self.host_cache.get(key) is None:
                self._release_intent(entry.id, target, intent_id)
                raise LoadFailed(job.error or f"staging {key} on node {self.node} did not complete")
            return self._staged_result(entry, key, reason, kind, value, noop=True, evicted=[], intent_id=intent_id)
        error: WorkerError | None = None
        before = {e.key for e in self.host_cache.entries()}
        try:
            self._write_node()
            self._stage(job, entry, value)
        except WorkerError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - anything else still fails the stage cleanly
            error = LoadFailed(f"staging {key} on node {self.node} failed: {type(exc).__name__}: {exc}")
        finally:
            self.stages.finish(key, reason=reason if error is None else None)
            job.error = str(error) if error is not None else None
            job.done.set()
        if error is not None:
            # Cut the frames that held the half-read arena, so its memory goes now (nothing half-staged).
            error.__traceback__ = error.__context__ = error.__cause__ = None
            trim_host_memory()
            self._write_node()
            self._release_intent(entry.id, target, intent_id)
            self._node_event("failed", entry.id, str(error), {"version": entry.version, "action": "stage",
                                                              "cancelled": isinstance(error, Cancelled)})
            log.warning("stage of %s on %s failed: %s", key, self.node, error)
            raise error
        evicted = sorted(before - {e.key for e in self.host_cache.entries()} - {key})
        self.stages.forget(evicted)
        for k in evicted:
            m, _, v = k.rpartition("@")
            self._node_event("unstaged", m, f"value-per-byte eviction to stage {key}", {"version": v})
        return self._staged_result(entry, key, reason, kind, value, noop=False, evicted=evicted, intent_id=intent_id)

    def _stage(self, job: StageJob, entry: ModelEntry, value: float) -> None:
        key = entry.key
        _, meta = _meta_module(entry, "staging")
        from gpu_worker.loader import LoadError, expected_from_module

        # Checked against the module now, so a staged copy is one a preload can promote.
        expected = expected_from_module(meta)
        del meta
        files = _fingerprint(entry.weights)  # before reading: a file changed while we read shows as changed
        t0 = time.monotonic()
        last = [0.0]
        pace = self.options.load_pace_bytes_per_s

        def check() -> None:
            if job.cancel:
                raise Cancelled(f"stage of {key} on node {self.node} was cancelled: {job.cancel_reason}")

        def progress(done: int, total: int) -> None:
            check()  # raising here stops the read; the cache frees what it allocated
            now = time.monotonic()
            if now - last[0] >= self.options.progress_publish_seconds or done == total:
                last[0] = now
                self.stages.update(job, done, total)
                self._write_node()
            if pace:
                while (wait := done / pace - (time.monotonic() - t0)) > 0:
                    time.sleep(min(wait, 0.1))
                    check()

        try:
            self.host_cache.stage(key, entry.weights, value=value, progress=progress,
                                  threads=self.options.load_threads, expected=expected, roots=entry.roots)
        except HostCacheFull as exc:
            raise DoesNotFit(f"staging {key} on node {self.node}: {exc}") from None
        except (Cancelled, WorkerError):
            raise
        except (SafetensorsError, LoadError, OSError) as exc:
            raise LoadFailed(f"staging {key} on node {self.node}: {exc}") from None
        self.stages.set_files(key, files or {})
        # An unstage that came as the read finished waits for us (job.done) and then drops it: no race here.

    def _staged_result(self, entry: ModelEntry, key: str, reason: str, kind: str, value: float, *, noop: bool,
                       evicted: list[str], intent_id: str) -> dict[str, Any]:
        e = self.host_cache.get(key)
        if e is not None and noop:
            self.host_cache.set_value(key, max(e.value, float(value)))
        target = state.host_id(self.node)
        self._release_intent(entry.id, target, intent_id)
        if e is None:  # evicted in the meantime by another stage: report it honestly
            raise LoadFailed(f"staging {key} on node {self.node}: evicted from the host cache before the "
                             "stage could report it")
        self._write_node()
        if not noop:
            self._node_event("staged", entry.id, f"staged {key} in host memory ({format_bytes(e.nbytes)})",
                             {"version": entry.version, "bytes": e.nbytes, "stage_seconds": round(e.stage_seconds, 4),
                              "value": e.value, "evicted": evicted, "kind": kind, "reason": reason})
            log.info("%s staged on %s: %d bytes in %.2f s%s", key, self.node, e.nbytes, e.stage_seconds,
                     f" (evicted {', '.join(evicted)})" if evicted else "")
        return {"model": entry.id, "version": entry.version, "node": self.node, "state": rs.STAGED,
                "bytes": e.nbytes, "stage_seconds": round(e.stage_seconds, 4), "value": e.value, "pinned": e.pinned,
                "noop": noop, "evicted": evicted, "host_cache": self._cache_figures()}

    def unstage(self, model: str, version: str | None = None, *, reason: str = "",
                cancel_timeout: float = 120.0, intent_id: str = "") -> dict[str, Any]:
        """Drop `model` (every version unless `version`) from the node's host cache; cancels a stage of it
        in progress; idempotent. Device replicas are not touched."""

        def match(k: str) -> bool:
            m, _, v = k.rpartition("@")
            return m == model and (not version or v == version)

        jobs = self.stages.cancel(match, f"unstaged while staging ({reason or 'unstage'})")
        for j in jobs:
            j.done.wait(cancel_timeout)
        targets = [e.key for e in self.host_cache.entries() if match(e.key)]
        freed = sum(self.host_cache.evict(k) for k in targets)
        asleep, engine_bytes = self.drop_sleepers(model, version, reason)  # vLLM engines asleep (CUDA)
        freed += engine_bytes
        targets += [f"{model}@{v}" for v in asleep]
        self.stages.forget(targets)
        if targets or jobs:
            trim_host_memory()
        self._write_node()
        self._release_intent(model, state.host_id(self.node), intent_id)
        versions = sorted(k.rpartition("@")[2] for k in targets)
        if targets:
            self._node_event("unstaged", model, reason or "unstaged", {"versions": versions, "bytes_freed": freed})
        return {"model": model, "node": self.node, "versions": versions, "bytes_freed": freed,
                "noop": not targets and not jobs, "host_cache": self._cache_figures()}


def _fingerprint(weights: Path | str) -> dict[str, tuple[int, int]] | None:
    """Size and mtime of every weight file; None when they cannot be listed (then nothing is compared)."""
    try:
        return {str(f): (st.st_size, st.st_mtime_ns) for f in weight_files(weights) for st in [f.stat()]}
    except (SafetensorsError, OSError):
        return None

