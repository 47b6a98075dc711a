"""What a worker process holds on its GPUs, and the preload / evict / infer operations on it.

`NodeWorker` is the worker without Celery: one per process, one `GpuSlot` per device. The Celery tasks
(`gpu_worker.tasks`) are thin wrappers around its methods, so the semantics can be exercised in-process.

Rules it keeps (issue 2, items 5 and 8):
- Replicas go pending -> loading (bytes done / total) -> warming -> ready, or failed with a reason. Every
  transition is written to Redis at once; the heartbeat rewrites the whole set with a TTL.
- A preload reserves device memory before it allocates; it is refused (DoesNotFit) when the model cannot
  fit the free budget — once no evict of another resident of that GPU is in flight (the scheduler sends a
  make-room evict and the preload it makes room for together, and the thread pool may start the preload
  first: it waits for that evict, at most EVICT_WAIT_SECONDS, rather than fail). A second preload of a resident model is a no-op; concurrent preloads of one model
  on one GPU load it once (the later ones wait for the first and report its outcome).
- Any failure drops every tensor the load allocated and returns the accounting to where it was; the
  replica shows `failed` with the reason until the next preload or evict of that model (or a retention
  period), and the worker keeps serving.
- Infer never takes a lock a load holds: a preload in progress does not block inference on ready models.
- On ready or failed the in-flight intent is released and an event recorded (actor "worker"); measured
  load+warmup seconds, the load/warmup histograms and the close of the model's cold start are recorded
  at that moment (prewarm.store.ready).
- The node's host cache (issue 4's staging tier, `gpu_worker.staging.HostCache`): `stage` reads a model's
  weights into host memory (no device memory), `unstage` drops them; a preload of a staged model promotes
  it from there (no storage I/O) and reports `source: "host"`. Staged models are node-level records
  (keys.staged(node), keys.host_cache(node)), published at once and with every heartbeat.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis
import torch

from gpu_worker.device import Device, make_device, module_bytes, trim_host_memory
from gpu_worker.devmem import DeviceArena
from gpu_worker.errors import (
    BadRequest,
    Busy,
    Cancelled,
    CatalogRefused,
    DoesNotFit,
    LoadFailed,
    NotResident,
    UnknownModel,
    WarmupFailed,
    WorkerError,
)
from gpu_worker.staging import HostCache, HostCacheFull
from prewarm import events, keys, state
from prewarm.catalog import Catalog, CatalogError, ModelEntry, WarmupInput, load_catalog
from prewarm.config import DeviceSpec, Settings, format_bytes
from prewarm.safetensors_header import SafetensorsError, read_header, weight_files
from prewarm.store.ready import replica_ready

log = logging.getLogger("prewarm.worker")

IN_FLIGHT = state.IN_FLIGHT_STATES
TORCH_INPUT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                      "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
MAX_INFER_ELEMENTS = 1 << 22
EVICT_WAIT_SECONDS = 10.0  # how long a preload that does not fit waits for an evict in flight on its GPU


@dataclass
class WorkerOptions:
    heartbeat_seconds: float = 2.0
    heartbeat_ttl: float = 10.0
    event_log_max: int = 5000
    warmup_min_passes: int = 3  # the first pass is cold (allocator, kernels); stability needs two more
    warmup_max_passes: int = 10
    warmup_tolerance: float = 0.15  # last two passes within 15% of each other: latency is stable
    warmup_max_seconds: float = 5.0  # per input: past this (and the minimum passes) stop even if not stable
    progress_publish_seconds: float = 0.2
    max_loads_per_gpu: int = 2  # concurrent loads on one GPU; more preloads wait in the queue (see Busy)
    failed_retention_seconds: float = 600.0
    queued_retention_seconds: float = 900.0  # a queued preload's placeholder whose task never came back
    load_threads: int | None = None
    # Paces the load phase to at most this many bytes/s (reporting and completion; the reader threads are
    # not slowed). For demos that want to watch progress and for tests that must catch a load in flight.
    load_pace_bytes_per_s: float | None = None
    # The node's host cache budget; None: $PREWARM_HOST_CACHE, else a quarter of physical memory.
    host_cache_bytes: int | None = None
    # A CPU virtual GPU's memory as a GPU's: one pre-faulted arena of its budget that loads write into
    # (gpu_worker/devmem.py); evicted bytes go back to the arena, not to the OS. Off: new memory per load.
    cpu_device_arena: bool = False

    @classmethod
    def from_settings(cls, s: Settings, env: dict[str, str] | None = None) -> WorkerOptions:
        e = os.environ if env is None else env
        pace = e.get("PREWARM_LOAD_PACE_BYTES_PER_S")
        threads = e.get("PREWARM_LOAD_THREADS")
        return cls(heartbeat_seconds=s.heartbeat_seconds, heartbeat_ttl=s.heartbeat_ttl,
                   event_log_max=s.event_log_max,
                   warmup_max_passes=int(e.get("PREWARM_WARMUP_MAX_PASSES") or 10),
                   warmup_max_seconds=float(e.get("PREWARM_WARMUP_MAX_SECONDS") or 5.0),
                   max_loads_per_gpu=s.max_loads_per_gpu,
                   failed_retention_seconds=float(e.get("PREWARM_FAILED_RETENTION_SECONDS") or 600.0),
                   load_threads=int(threads) if threads else None,
                   load_pace_bytes_per_s=float(pace) if pace else None,
                   cpu_device_arena=(e.get("PREWARM_CPU_DEVICE_ARENA") or "").strip().lower() in ("1", "true", "yes", "on"))


@dataclass
class StageJob:
    """A stage into the host cache in progress: its published record and how to cancel it."""

    record: state.Staged
    done: threading.Event = field(default_factory=threading.Event)
    cancel: bool = False
    cancel_reason: str = ""
    error: str | None = None


@dataclass
class Slot:
    """One replica on one GPU: its published record plus what only this process holds."""

    record: state.Replica
    module: torch.nn.Module | None = None
    done: threading.Event = field(default_factory=threading.Event)  # set when a load ends (ready or failed)
    cancel: bool = False
    cancel_reason: str = ""
    warmup: list[dict[str, Any]] = field(default_factory=list)
    # A placeholder for a preload waiting in the queue for a free load slot: shown `pending`, owns nothing,
    # taken over by the first preload of it that may run.
    queued: bool = False
    task_ids: set[str] = field(default_factory=set)  # preload tasks waiting on this replica (see evict)


class GpuSlot:
    """One device this worker serves, its replicas and its publication to Redis."""

    def __init__(self, node: str, spec: DeviceSpec, worker_id: str, started_at: float) -> None:
        self.node = node
        self.spec = spec
        self.id = state.gpu_id(node, spec.device)
        self.queue = state.queue_name(node, spec.device)
        self.device: Device = make_device(spec, self.id)
        self.worker_id = worker_id
        self.started_at = started_at
        self.lock = threading.Lock()  # guards `replicas` and the records in it; never held during I/O-heavy work
        self.publish_lock = threading.Lock()  # one writer at a time: a snapshot is never overtaken by an older one
        self.replicas: dict[str, Slot] = {}  # "model@version" -> Slot
        self.cancelled_tasks: dict[str, float] = {}  # preload task id -> when an evict cancelled it
        # A CPU virtual GPU's pre-faulted memory, when WorkerOptions.cpu_device_arena (see NodeWorker).
        self.arena: DeviceArena | None = None

    def active_loads(self) -> int:
        """Loads running now (placeholders of queued preloads not counted). Call with `lock` held."""
        return sum(x.record.state in IN_FLIGHT and not x.queued for x in self.replicas.values())

    def gpu_record(self) -> state.Gpu:
        inv = self.device.inventory()
        return state.Gpu(id=self.id, node=self.node, device=self.spec.device, queue=self.queue,
                         total_bytes=inv.total_bytes, used_bytes=inv.used_bytes, free_bytes=inv.free_bytes,
                         last_heartbeat=time.time(), worker=self.worker_id, started_at=self.started_at,
                         kind=self.device.kind)

    def residents(self) -> list[str]:
        with self.lock:
            return [k for k, s in self.replicas.items() if s.record.state != "failed"]


def _import_builder(path: str) -> Callable[..., torch.nn.Module]:
    module_name, _, func = path.partition(":")
    mod = importlib.import_module(module_name)
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise AttributeError(f"{module_name} has no function {func!r}")
    return fn


def _meta_module(entry: ModelEntry, doing: str) -> tuple[Callable[..., torch.nn.Module], torch.nn.Module]:
    """The entry's builder and its module built on the meta device (the shape: no memory, no random
    init), or a LoadFailed naming the builder and what went wrong."""
    try:
        builder = _import_builder(entry.builder)
        with torch.device("meta"):
            meta = builder(**entry.builder_args)
        if not isinstance(meta, torch.nn.Module):
            raise TypeError(f"returned {type(meta).__name__}, not a torch.nn.Module")
    except Exception as exc:  # noqa: BLE001
        raise LoadFailed(f"{doing} {entry.key}: builder {entry.builder}({_args(entry.builder_args)}) failed: "
                         f"{type(exc).__name__}: {exc}") from None
    return builder, meta

def make_input(spec: WarmupInput, device: torch.device, *, default_high: int = 2, seed: int = 0) -> torch.Tensor:
    """A deterministic sample input for a declared shape and dtype."""
    dtype = TORCH_INPUT_DTYPES[spec.dtype]
    gen = torch.Generator().manual_seed(seed)
    if spec.dtype in ("int64", "int32"):
        x = torch.randint(0, spec.high or default_high, spec.shape, generator=gen, dtype=dtype)
    elif spec.dtype == "bool":
        x = torch.randint(0, 2, spec.shape, generator=gen).bool()
    else:
        x = torch.randn(spec.shape, generator=gen).to(dtype)
    return x.to(device)


def summarize(y: Any) -> dict[str, Any]:
    """A small JSON-able summary of a module's output."""
    if isinstance(y, tuple | list):
        y = y[0]
    if isinstance(y, dict):
        y = next(iter(y.values()))
    if not isinstance(y, torch.Tensor):
        return {"type": type(y).__name__}
    f = y.detach().float()
    out: dict[str, Any] = {"shape": list(y.shape), "dtype": str(y.dtype).removeprefix("torch."),
                           "mean": float(f.mean()), "std": float(f.std()) if f.numel() > 1 else 0.0,
                           "min": float(f.min()), "max": float(f.max()),
                           "finite": bool(torch.isfinite(f).all())}
    if y.dim() >= 2:
        last = f.reshape(-1, f.shape[-1])[-1]
        out["top"] = [int(i) for i in torch.topk(last, k=min(5, last.numel())).indices]
    return out


class NodeWorker:
    """Every GPU this process serves; the operations behind the Celery tasks."""

    def __init__(self, r: redis.Redis, catalog_path: Path, node: str, devices: list[DeviceSpec],
                 options: WorkerOptions | None = None, *, worker_id: str | None = None) -> None:
        self.r = r
        self.catalog_path = Path(catalog_path)
        self.node = node
        self.options = options or WorkerOptions()
        self.worker_id = worker_id or f"{node}:{os.getpid()}:{os.urandom(3).hex()}"
        self.started_at = time.time()
        if not devices:
            raise ValueError("a worker needs at least one device")
        self.gpus: dict[str, GpuSlot] = {}
        for spec in devices:
            g = GpuSlot(node, spec, self.worker_id, self.started_at)
            if self.options.cpu_device_arena and g.device.kind == "cpu":
                g.arena = DeviceArena(g.device.total_bytes())  # faulted in now, as a GPU's memory exists
            self.gpus[g.id] = g
        self._by_queue = {g.queue: g for g in self.gpus.values()}
        self.claimed: set[str] = set()  # GPUs this worker holds the claim on (heartbeat.claim_gpus)
        self._catalog: Catalog | None = None
        self._catalog_mtime = -1.0
        self._catalog_error: str | None = None
        self._catalog_lock = threading.Lock()
        # One host cache per node (this process serves the node's devices). Pin only for CUDA devices:
        # page-locking for CPU virtual GPUs would start a CUDA context for nothing.
        self.host_cache = HostCache(self.options.host_cache_bytes, pin=any(d.is_cuda for d in devices))
        self._stage_lock = threading.Lock()  # guards _stages and _stage_reasons
        self._stages: dict[str, StageJob] = {}  # "model@version" being staged now
        self._stage_reasons: dict[str, str | None] = {}
        # Size and mtime of each weight file as it was staged: a promotion checks them (metadata only).
        self._stage_files: dict[str, dict[str, tuple[int, int]]] = {}
        self._node_publish_lock = threading.Lock()
        self._node_closed = False  # set by shutdown: a stage ending after it must not re-announce the node

    # --- catalog ----------------------------------------------------------------------------------
    def catalog(self) -> Catalog:
        """The catalog, reloaded when its file changes. Loaded leniently (issue 17): a bad entry (weights
        outside the model roots, a builder that does not import, a broken file) is refused by name —
        logged, published with the heartbeat (catalog_problems) — and every other entry is served. A file
        that cannot be read as a catalog at all keeps the last good one."""
        with self._catalog_lock:
            try:
                mtime = self.catalog_path.stat().st_mtime
            except FileNotFoundError:
                mtime = -2.0
            if mtime != self._catalog_mtime:
                self._catalog_mtime = mtime
                try:
                    cat = load_catalog(self.catalog_path, strict=False)
                except CatalogError as exc:
                    self._catalog_error = str(exc)
                    log.error("catalog %s: %s", self.catalog_path, exc)
                else:
                    self._catalog, self._catalog_error = cat, None
                    for name, problem in cat.problems.items():
                        log.error("catalog %s: model %s refused (the other models are served): %s",
                                  self.catalog_path, name, problem)
            if self._catalog is None:
                raise UnknownModel(f"this worker has no usable catalog: {self._catalog_error}")
            return self._catalog

    def catalog_problems(self) -> dict[str, str]:
        """What this worker refused of its catalog as last read: entry name -> problem, and the catalog
        file's own error under its path (a last good catalog is then in use, or none)."""
        with self._catalog_lock:
            problems = dict(self._catalog.problems) if self._catalog is not None else {}
            if self._catalog_error:
                problems[str(self.catalog_path)] = self._catalog_error
        return problems

    def entry(self, model: str, version: str | None) -> ModelEntry:
        cat = self.catalog()
        extra = f" (the catalog file has an error, the last good one is in use: {self._catalog_error})" \
            if self._catalog_error else ""
        refused = cat.problems.get(model)
        if refused is not None and (model not in cat or version and not any(
                m.version == version for m in cat.versions(model))):
            raise CatalogRefused(f"{refused} (this worker refused that catalog entry; it serves the others)"
                                 f"{extra}")
        if model not in cat:
            raise UnknownModel(f"unknown model {model!r}: not in the catalog {self.catalog_path} this worker "
                               f"serves{extra}")
        try:
            return cat.get(model, version or None)
        except KeyError:
            known = ", ".join(m.version for m in cat.versions(model))
            raise UnknownModel(f"unknown model version {model}@{version}: the catalog {self.catalog_path} has "
                               f"{model} in version(s) {known}{extra}") from None

    # --- which GPU ---------------------------------------------------------------------------------
    def gpu_for(self, gpu: str | None = None, routing_key: str | None = None) -> GpuSlot:
        """The GPU a task is for: the `gpu` kwarg (id or device name), else the queue it arrived on."""
        if gpu:
            for g in self.gpus.values():
                if gpu in (g.id, g.spec.device, g.queue):
                    return g
            raise BadRequest(f"GPU {gpu!r} is not served by this worker (it serves {', '.join(self.gpus)})")
        if routing_key and routing_key in self._by_queue:
            return self._by_queue[routing_key]
        if len(self.gpus) == 1:
            return next(iter(self.gpus.values()))
        raise BadRequest(f"cannot tell which GPU the task is for (queue {routing_key!r}); pass gpu=<node/device>")

    # --- publication ------------------------------------------------------------------------------
    def publish(self, g: GpuSlot, s: Slot) -> None:
        """Write one replica's current record (under the GPU's publish lock, with the heartbeat's TTL)."""
        with g.publish_lock:
            with g.lock:
                rec = replace(s.record)
                current = g.replicas.get(state.replica_field(rec.model, rec.version)) is s
            if not current:
                return  # evicted or replaced meanwhile: do not resurrect it
            try:
                state.put_replica(self.r, rec, self.options.heartbeat_ttl)
                # The inventory changes with the replica: publish it at once, not at the next heartbeat.
                self._write_gpu(g)
            except redis.RedisError as exc:
                log.warning("could not publish %s on %s: %s", rec.model, g.id, exc)

    def _write_gpu(self, g: GpuSlot) -> None:
        """Refresh the GPU's inventory hash alone (the replicas hash is written separately)."""
        rec = g.gpu_record()
        info = {"node": rec.node, "device": rec.device, "queue": rec.queue, "total_bytes": rec.total_bytes,
                "used_bytes": rec.used_bytes, "free_bytes": rec.free_bytes,
                "last_heartbeat": rec.last_heartbeat, "worker": rec.worker, "started_at": rec.started_at,
                "kind": rec.kind}
        pipe = self.r.pipeline(transaction=True)
        pipe.sadd(keys.GPUS, g.id)
        pipe.hset(keys.gpu(g.id), mapping=info)
        pipe.pexpire(keys.gpu(g.id), int(self.options.heartbeat_ttl * 1000))
        pipe.execute()

    def heartbeat(self) -> None:
        """Announce every GPU with its full replica set; expire old failed records."""
        now = time.time()
        for g in self.gpus.values():
            with g.publish_lock:
                with g.lock:
                    for k, s in list(g.replicas.items()):
                        age = now - s.record.since
                        if (s.record.state == "failed" and age > self.options.failed_retention_seconds) or \
                                (s.queued and age > self.options.queued_retention_seconds):
                            del g.replicas[k]
                    for tid, at in list(g.cancelled_tasks.items()):
                        if now - at > 3600:
                            del g.cancelled_tasks[tid]
                    reps = [replace(s.record) for s in g.replicas.values()]
                state.write_heartbeat(self.r, g.gpu_record(), reps, self.options.heartbeat_ttl)
        self._write_node()

    def node_state(self) -> tuple[state.Node, list[state.Staged]]:
        """The node's host cache inventory and staged models, as published."""
        cache = self.host_cache
        entries = cache.entries()
        used = cache.used_bytes
        with self._stage_lock:
            staged = [state.Staged(model=m, version=v, node=self.node, state="staged", bytes=e.nbytes,
                                   total_bytes=e.nbytes, progress=1.0, value=e.value, staged_at=e.staged_at,
                                   stage_seconds=round(e.stage_seconds, 4), pinned=e.pinned,
                                   promotions=e.promotions, last_promoted_at=e.last_promoted_at,
                                   reason=self._stage_reasons.get(e.key))
                      for e in entries for m, _, v in [e.key.rpartition("@")]]
            done = {e.key for e in entries}
            staged += [replace(j.record) for k, j in self._stages.items() if k not in done]
        node = state.Node(node=self.node, budget_bytes=cache.budget_bytes, used_bytes=used,
                          free_bytes=cache.budget_bytes - used, last_heartbeat=time.time(), worker=self.worker_id,
                          pinned=cache.pinned, catalog_problems=self.catalog_problems())
        return node, staged

    def _write_node(self) -> None:
        """Rewrite the node's host cache record and full staged set (small: a few entries per node)."""
        with self._node_publish_lock:
            if self._node_closed:
                return
            node, staged = self.node_state()
            try:
                state.write_node(self.r, node, staged, self.options.heartbeat_ttl)
            except redis.RedisError as exc:
                log.warning("could not publish the host cache of %s: %s", self.node, exc)

    def _cache_figures(self) -> dict[str, int]:
        used = self.host_cache.used_bytes
        return {"budget_bytes": self.host_cache.budget_bytes, "used_bytes": used,
                "free_bytes": self.host_cache.budget_bytes - used}

    def _drop_published(self, g: GpuSlot, model: str, version: str) -> None:
        with g.publish_lock:
            try:
                state.drop_replica(self.r, g.id, model, version)
                self._write_gpu(g)
            except redis.RedisError as exc:
                log.warning("could not unpublish %s on %s: %s", model, g.id, exc)

    def _event(self, kind: str, model: str, g: GpuSlot, reason: str, numbers: dict[str, Any]) -> None:
        try:
            events.record(self.r, kind, "worker", model=model, gpu=g.id, reason=reason, numbers=numbers,
                          maxlen=self.options.event_log_max)
        except redis.RedisError as exc:
            log.warning("could not record event %s %s: %s", kind, model, exc)

    def _release_intent(self, model: str, g: GpuSlot | str, intent_id: str) -> None:
        """Release this task's own intent (`intent_id`; "": a task sent without one releases only an intent
        claimed without one): an evict that took over a preload's intent keeps it when that load ends."""
        target = g if isinstance(g, str) else g.id
        try:
            state.release_intent(self.r, model, target, intent_id)
        except redis.RedisError as exc:
            log.warning("could not release intent %s on %s: %s", model, target, exc)

    def _node_event(self, kind: str, model: str, reason: str, numbers: dict[str, Any]) -> None:
        try:
            events.record(self.r, kind, "worker", model=model, gpu=state.host_id(self.node), reason=reason,
                          numbers=numbers, maxlen=self.options.event_log_max)
        except redis.RedisError as exc:
            log.warning("could not record event %s %s: %s", kind, model, exc)

    # --- preload ----------------------------------------------------------------------------------
    def preload(self, g: GpuSlot, model: str, version: str | None = None, *, reason: str = "",
                kind: str = "", defer: bool = False, task_id: str | None = None,
                intent_id: str = "") -> dict[str, Any]:
        """Load and warm `model` on GPU `g`; returns the ready replica's figures (see tasks.py).

        With `defer`, raise Busy instead of waiting: when this model is already loading here (its outcome
        will be this one's), or when the GPU runs `max_loads_per_gpu` loads already (the replica then shows
        `pending` until a load slot frees), or when the model is being staged in this node's host cache (it
        is promoted from there once staged, rather than read from storage twice). The Celery task retries
        then, so waiting preloads sit in the queue rather than on the threads inference needs. `task_id`
        lets an evict cancel a waiting preload; `intent_id` (the dispatch's intent) is the intent this preload
        releases when it ends, and lets an evict that superseded it cancel it before it starts.
        """
        try:
            entry = self.entry(model, version)
        except UnknownModel as exc:
            self._fail_unknown(g, model, version, str(exc), intent_id)
            raise
        key = entry.key
        now = time.time()
        placeholder: Slot | None = None
        with self._stage_lock:
            staging = key in self._stages
        with g.lock:
            if (task_id and task_id in g.cancelled_tasks) or (intent_id and intent_id in g.cancelled_tasks):
                raise Cancelled(f"preload of {key} on {g.id} was cancelled by an evict while it waited")
            s = g.replicas.get(key)
            busy = defer and (staging or g.active_loads() >= self.options.max_loads_per_gpu)
            if s is not None and s.record.state == "ready":
                owner, waiting = False, False
            elif s is not None and s.queued and not busy:
                s.queued = False  # a queued preload's turn: this task loads it
                s.record.reason = s.record.reason or reason or None
                owner, waiting = True, False
            elif s is not None and s.record.state in IN_FLIGHT:  # loading now (or queued while busy)
                if defer:
                    if task_id:
                        s.task_ids.add(task_id)
                    raise Busy(f"{key} is {'queued' if s.queued else 'already loading'} on {g.id}")
                owner, waiting = False, True
            else:
                s = Slot(state.Replica(model=entry.id, version=entry.version, gpu=g.id, state="pending",
                                       total_bytes=entry.size_bytes, since=now, created_at=now,
                                       reason=reason or None), queued=busy)
                if task_id:
                    s.task_ids.add(task_id)
                g.replicas[key] = s
                owner, waiting = not busy, False
                if busy:
                    placeholder = s
        if placeholder is not None:
            self.publish(g, placeholder)
            if staging:
                raise Busy(f"{key} is being staged on node {self.node}; the preload waits to promote it")
            raise Busy(f"{g.id} runs {self.options.max_loads_per_gpu} load(s) already; {key} is queued")
        if not owner:
            if waiting:
                s.done.wait()  # the first preload's outcome is this one's
            self._release_intent(entry.id, g, intent_id)
            with g.lock:
                rec = replace(s.record)
            if rec.state != "ready":
                raise LoadFailed(rec.error or f"preload of {key} on {g.id} did not complete ({rec.state})")
            return self._result(rec, s, noop=True)
        self.publish(g, s)
        try:
            self._load(g, s, entry)
        except WorkerError as exc:
            return self._failed(g, s, entry, exc, intent_id)
        except Exception as exc:  # noqa: BLE001 - anything else still fails the replica cleanly
            return self._failed(g, s, entry, LoadFailed(f"preload of {key} on {g.id} failed: "
                                                         f"{type(exc).__name__}: {exc}"), intent_id)
        finally:
            s.done.set()
        with g.lock:
            rec = replace(s.record)
        try:  # its load time, load/warmup histograms and the close of its cold start, once, now
            replica_ready(self.r, rec)
        except redis.RedisError as exc:
            log.warning("could not record load time of %s: %s", key, exc)
        self._release_intent(entry.id, g, intent_id)
        self._event("ready", entry.id, g, f"loaded and warmed {key} ({format_bytes(rec.bytes)}, from {rec.source})",
                    {"version": entry.version, "bytes": rec.bytes, "load_seconds": rec.load_seconds,
                     "warmup_seconds": rec.warmup_seconds, "kind": kind, "source": rec.source})
        return self._result(rec, s, noop=False)

    def _result(self, rec: state.Replica, s: Slot, *, noop: bool) -> dict[str, Any]:
        return {"model": rec.model, "version": rec.version, "gpu": rec.gpu, "state": rec.state,
                "bytes": rec.bytes, "load_seconds": rec.load_seconds, "warmup_seconds": rec.warmup_seconds,
                "warmup": list(s.warmup), "noop": noop, "source": rec.source}

    def _set(self, g: GpuSlot, s: Slot, **changes: Any) -> None:
        with g.lock:
            for k, v in changes.items():
                setattr(s.record, k, v)
            if "state" in changes:
                s.record.since = time.time()
        self.publish(g, s)

    def _check_cancel(self, g: GpuSlot, s: Slot) -> None:
        if s.cancel:
            raise Cancelled(f"preload of {s.record.model}@{s.record.version} on {g.id} was cancelled: "
                            f"{s.cancel_reason or 'evicted while loading'}")

    def _load(self, g: GpuSlot, s: Slot, entry: ModelEntry) -> None:
        key = entry.key
        dev = g.device
        # 1. The module's shape, on the meta device: no memory, no random init.
        builder, meta = _meta_module(entry, "building")
        from gpu_worker.loader import expected_from_module

        expected = expected_from_module(meta)
        persistent = set(expected)
        # Buffers outside the state dict are made by the builder, not read from the weights.
        extra = [n for n, _ in meta.named_buffers() if n not in persistent]
        del meta
        # 2. Reserve what the weights need before allocating any of it. A model staged in this node's host
        #    cache is promoted from there (its bytes are known, no storage I/O at all); otherwise the headers
        #    say exactly how much (read now, not from the catalog's cache, so a file changed since is
        #    measured as it is).
        staged = self._staged_bytes(entry, expected)
        if staged is not None:
            need, source = staged, "host"
        else:
            source = "storage"
            try:
                roots = entry.roots  # each file checked against them as it is opened
                need = sum(read_header(f, roots).data_bytes for f in weight_files(entry.weights, roots))
            except SafetensorsError as exc:
                raise LoadFailed(f"loading {key} onto {g.id}: {exc}") from None
        self._check_cancel(g, s)
        self._reserve(g, s, key, need)
        module: torch.nn.Module | None = None
        error: WorkerError | None = None
        try:
            self._set(g, s, state="loading", total_bytes=need, bytes=0, progress=0.0, source=source)
            t0 = time.perf_counter()
            module = self._read(g, s, entry, builder, expected, extra)
            measured = module_bytes(module)
            dev.commit(key, measured)
            load_seconds = time.perf_counter() - t0
            self._check_cancel(g, s)
            self._set(g, s, state="warming", bytes=measured, progress=1.0, load_seconds=round(load_seconds, 4))
            t1 = time.perf_counter()
            s.warmup = self._warm(g, s, entry, module)
            warmup_seconds = time.perf_counter() - t1
            with g.lock:
                s.module = module
            self._set(g, s, state="ready", warmup_seconds=round(warmup_seconds, 4))
            log.info("%s ready on %s: %d bytes, load %.2f s (from %s), warmup %.2f s", key, g.id, measured,
                     load_seconds, s.record.source, warmup_seconds)
            if s.record.source == "host":
                self._write_node()  # the staged copy's promotion count changed
        except WorkerError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001
            error = LoadFailed(f"preload of {key} on {g.id} failed: {type(exc).__name__}: {exc}")
        if error is not None:
            # The error's traceback and context reach the frames that held the load's tensors (a partly
            # assigned module): cut them, so the memory is returned now, not whenever the error is collected.
            error.__traceback__ = None
            error.__context__ = None
            error.__cause__ = None
            with g.lock:
                s.module = None
            module = None
            dev.release(key)
            dev.reclaim()
            raise error

    def _reserve(self, g: GpuSlot, s: Slot, key: str, need: int) -> None:
        """Reserve `need` bytes for `key` on `g`; DoesNotFit when they do not fit — unless an evict of another
        resident here is in flight (its intent claimed, the task queued or running): the scheduler sends a
        make-room evict and the preload it makes room for at once, and with a thread pool the preload can
        get here first. Then wait for that evict (polling, at most EVICT_WAIT_SECONDS) and try again."""
        deadline = time.monotonic() + EVICT_WAIT_SECONDS
        waited = False
        while True:
            try:
                g.device.reserve(key, need, residents=[k for k in g.residents() if k != key])
                if waited:
                    log.info("%s on %s: reserved once the evict in flight made room", key, g.id)
                return
            except DoesNotFit:
                if time.monotonic() >= deadline or not self._evict_in_flight(g, key):
                    raise
            waited = True
            time.sleep(0.05)
            self._check_cancel(g, s)

    def _evict_in_flight(self, g: GpuSlot, key: str) -> bool:
        """An evict intent (claimed by the dispatcher, released by our evict once its bytes are freed) is held
        for a model with a replica on `g` other than `key`."""
        with g.lock:
            models = sorted({x.record.model for k, x in g.replicas.items()
                             if k != key and x.record.state != "failed"})
        try:
            held = state.held_intents(self.r, [(m, g.id) for m in models])
        except redis.RedisError:
            return False
        return any(it.action == "evict" for it in held)

    def _read(self, g: GpuSlot, s: Slot, entry: ModelEntry, builder: Callable[..., torch.nn.Module],
              expected: dict[str, tuple[torch.dtype, tuple[int, ...]]], extra: list[str]) -> torch.nn.Module:
        from gpu_worker.loader import LoadError, load_weights

        key = entry.key
        dev = g.device
        t0 = time.monotonic()
        last = [0.0]
        pace = self.options.load_pace_bytes_per_s

        def progress(done: int, total: int) -> None:
            self._check_cancel(g, s)  # raising here cancels the load
            now = time.monotonic()
            if now - last[0] >= self.options.progress_publish_seconds or done == total:
                last[0] = now
                self._set(g, s, bytes=done, progress=round(done / total, 4) if total else 1.0)
            if pace:
                wait = done / pace - (time.monotonic() - t0)
                while wait > 0:
                    time.sleep(min(wait, 0.1))
                    self._check_cancel(g, s)
                    wait = done / pace - (time.monotonic() - t0)

        tensors: dict[str, torch.Tensor] | None = None
        if s.record.source == "host":
            try:
                tensors = self.host_cache.promote(key, dev.torch_device, progress=progress)
            except KeyError:
                # Unstaged between our look and the copy: read it from storage after all.
                log.info("%s left the host cache before its promotion to %s; loading from storage", key, g.id)
                self._set(g, s, source="storage")
        try:
            if tensors is None:
                tensors = load_weights(entry.weights, dev.torch_device, progress=progress, expected=expected,
                                       threads=self.options.load_threads, roots=entry.roots,
                                       allocator=g.arena.allocate if g.arena is not None else None)
        except Cancelled:
            raise
        except (SafetensorsError, LoadError) as exc:
            raise LoadFailed(f"loading {key} onto {g.id}: {exc}") from None
        except OSError as exc:
            raise LoadFailed(f"loading {key} onto {g.id}: {exc}") from None
        try:
            if extra:
                # The module has buffers the weights do not carry: build it for real on the device.
                with dev.torch_device:
                    module = builder(**entry.builder_args)
            else:
                with torch.device("meta"):
                    module = builder(**entry.builder_args)
            module.load_state_dict(tensors, strict=True, assign=True)
        except Exception as exc:  # noqa: BLE001
            tensors.clear()
            raise LoadFailed(f"building {key} from {entry.weights}: {type(exc).__name__}: {exc}") from None
        tensors.clear()
        still_meta = [n for n, t in list(module.named_parameters()) + list(module.named_buffers())
                      if t.device.type == "meta"]
        if still_meta:
            raise LoadFailed(f"building {key}: {len(still_meta)} tensor(s) of the module have no weights, "
                             f"e.g. {still_meta[0]!r}; check the builder against {entry.weights}")
        module.eval()
        module.requires_grad_(False)
        return module

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
        with self._stage_lock:
            files = self._stage_files.get(key)
        now = _fingerprint(entry.weights) if files else None
        why = f"does not match its module (e.g. {wrong[0]!r})" if wrong else \
            "is older than its weight files (changed since staged)" if now is not None and now != files else ""
        if why:
            log.warning("staged copy of %s %s: unstaged, loading from storage", key, why)
            self.host_cache.evict(key)
            with self._stage_lock:
                self._stage_reasons.pop(key, None)
                self._stage_files.pop(key, None)
            self._write_node()
            self._node_event("unstaged", entry.id, f"staged copy {why}", {"version": entry.version})
            return None
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _warm(self, g: GpuSlot, s: Slot, entry: ModelEntry, module: torch.nn.Module) -> list[dict[str, Any]]:
        """Run every declared input until its latency is stable (bounded); returns per-input figures."""
        o = self.options
        out = []
        high = int(getattr(module, "vocab_size", 2) or 2)
        for i, spec in enumerate(entry.warmup):
            where = f"warmup input #{i} (shape {list(spec.shape)}, {spec.dtype})"
            try:
                x = make_input(spec, g.device.torch_device, default_high=high, seed=i)
            except Exception as exc:  # noqa: BLE001
                raise WarmupFailed(f"{entry.key} on {g.id}: {where}: cannot make the input: {exc}") from None
            lat: list[float] = []
            stable = False
            started = time.perf_counter()
            for _ in range(max(o.warmup_min_passes, o.warmup_max_passes)):
                self._check_cancel(g, s)
                t0 = time.perf_counter()
                try:
                    with torch.inference_mode():
                        y = module(x)
                    g.device.synchronize()
                except Exception as exc:  # noqa: BLE001
                    raise WarmupFailed(f"{entry.key} on {g.id}: {where} failed: {type(exc).__name__}: {exc}") \
                        from None
                lat.append(time.perf_counter() - t0)
                del y
                if len(lat) >= o.warmup_min_passes and \
                        abs(lat[-1] - lat[-2]) <= o.warmup_tolerance * max(lat[-1], lat[-2]):
                    stable = True
                    break
                if len(lat) >= o.warmup_min_passes and time.perf_counter() - started > o.warmup_max_seconds:
                    break  # a busy host may never look stable: the time bound keeps preloads finite
            out.append({"shape": list(spec.shape), "dtype": spec.dtype, "passes": len(lat), "stable": stable,
                        "latency_ms": round(lat[-1] * 1000, 3), "first_ms": round(lat[0] * 1000, 3)})
        return out

    def _failed(self, g: GpuSlot, s: Slot, entry: ModelEntry, exc: WorkerError, intent_id: str) -> dict[str, Any]:
        msg = str(exc)
        cancelled = isinstance(exc, Cancelled)
        with g.lock:
            s.module = None
            if cancelled:
                # An evict cancelled it: the replica is gone, not failed.
                if g.replicas.get(entry.key) is s:
                    del g.replicas[entry.key]
            s.record.state = "failed"
            s.record.error = msg
            s.record.bytes = 0
            s.record.progress = 0.0
            s.record.since = time.time()
        if cancelled:
            self._drop_published(g, entry.id, entry.version)
        else:
            self.publish(g, s)
        self._release_intent(entry.id, g, intent_id)
        self._event("failed", entry.id, g, msg, {"version": entry.version, "cancelled": cancelled})
        log.warning("preload of %s on %s failed: %s", entry.key, g.id, msg)
        raise exc

    def _fail_unknown(self, g: GpuSlot, model: str, version: str | None, msg: str, intent_id: str) -> None:
        v = version or "?"
        rec = state.Replica(model=model, version=v, gpu=g.id, state="failed", error=msg, since=time.time(),
                            created_at=time.time())
        s = Slot(rec)
        s.done.set()
        with g.lock:
            key = state.replica_field(model, v)
            if key not in g.replicas or g.replicas[key].record.state == "failed":
                g.replicas[key] = s
        self.publish(g, s)
        self._release_intent(model, g, intent_id)
        self._event("failed", model, g, msg, {"version": v})

    # --- evict ------------------------------------------------------------------------------------
    def evict(self, g: GpuSlot, model: str, version: str | None = None, *, reason: str = "",
              cancel_timeout: float = 120.0, intent_id: str = "", supersedes: str = "") -> dict[str, Any]:
        """Drop every replica of `model` (of `version` when given) on `g`; idempotent. A load of it in
        progress is cancelled. `supersedes`: the intent id of the preload this evict took over; a preload
        task carrying it that has not started yet is cancelled when it does."""
        with g.lock:
            if supersedes:
                g.cancelled_tasks[supersedes] = time.time()
            targets = [(k, s) for k, s in g.replicas.items()
                       if s.record.model == model and (not version or s.record.version == version)]
            now = time.time()
            for _, s in targets:
                # Preloads of it still waiting in the queue must not load it again after this evict.
                g.cancelled_tasks.update(dict.fromkeys(s.task_ids, now))
                if s.queued:
                    s.done.set()  # a placeholder: nothing is loading, nothing to wait for
                elif s.record.state in IN_FLIGHT:
                    s.cancel = True
                    s.cancel_reason = f"evicted while loading ({reason or 'evict'})"
        freed = 0
        versions: list[str] = []
        for k, s in targets:
            if not s.done.is_set() and s.record.state in IN_FLIGHT:
                s.done.wait(cancel_timeout)
            with g.lock:
                was = s.record.state
                if g.replicas.get(k) is s:
                    if was == "ready":
                        s.record.state = "evicting"
                        s.record.since = time.time()
                    del g.replicas[k]
                s.module = None  # running infers keep their own reference until they return
            freed += g.device.release(k)
            versions.append(s.record.version)
            self._drop_published(g, s.record.model, s.record.version)
        if targets:
            g.device.reclaim()
        self._release_intent(model, g, intent_id)
        inv = g.device.inventory()
        if targets:
            self._event("evicted", model, g, reason or "evicted",
                        {"versions": versions, "bytes_freed": freed, "free_bytes": inv.free_bytes})
        return {"model": model, "gpu": g.id, "versions": versions, "bytes_freed": freed, "noop": not targets,
                "free_bytes": inv.free_bytes, "used_bytes": inv.used_bytes}

    # --- host cache: stage / unstage ----------------------------------------------------------------
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
        with self._stage_lock:
            files = self._stage_files.get(key)
        if files and self.host_cache.get(key) is not None and (now := _fingerprint(entry.weights)) is not None \
                and now != files:
            # Its files changed since it was staged: this stage replaces the stale copy.
            self.host_cache.evict(key)
            self._node_event("unstaged", entry.id, "staged copy is older than its weight files (changed since "
                             "staged); staging again", {"version": entry.version})
        if self.host_cache.get(key) is not None:
            return self._staged_result(entry, key, reason, kind, value, noop=True, evicted=[], intent_id=intent_id)
        with self._stage_lock:
            job = self._stages.get(key)
            owner = job is None
            if owner:
                now = time.time()
                job = StageJob(state.Staged(model=entry.id, version=entry.version, node=self.node, state="staging",
                                            total_bytes=entry.size_bytes, value=float(value), staged_at=now,
                                            reason=reason or None))
                self._stages[key] = job
        assert job is not None
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
            with self._stage_lock:
                self._stages.pop(key, None)
                if error is None:
                    self._stage_reasons[key] = reason or None
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
        with self._stage_lock:
            for k in evicted:
                self._stage_reasons.pop(k, None)
                self._stage_files.pop(k, None)
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
                with self._stage_lock:
                    job.record.bytes, job.record.total_bytes = done, total
                    job.record.progress = round(done / total, 4) if total else 1.0
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
        with self._stage_lock:
            self._stage_files[key] = files or {}
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
        return {"model": entry.id, "version": entry.version, "node": self.node, "state": "staged",
                "bytes": e.nbytes, "stage_seconds": round(e.stage_seconds, 4), "value": e.value, "pinned": e.pinned,
                "noop": noop, "evicted": evicted, "host_cache": self._cache_figures()}

    def unstage(self, model: str, version: str | None = None, *, reason: str = "",
                cancel_timeout: float = 120.0, intent_id: str = "") -> dict[str, Any]:
        """Drop `model` (every version unless `version`) from the node's host cache; cancels a stage of it
        in progress; idempotent. Device replicas are not touched."""

        def match(k: str) -> bool:
            m, _, v = k.rpartition("@")
            return m == model and (not version or v == version)

        with self._stage_lock:
            jobs = [j for k, j in self._stages.items() if match(k)]
            for j in jobs:
                j.cancel, j.cancel_reason = True, f"unstaged while staging ({reason or 'unstage'})"
        for j in jobs:
            j.done.wait(cancel_timeout)
        targets = [e.key for e in self.host_cache.entries() if match(e.key)]
        freed = sum(self.host_cache.evict(k) for k in targets)
        with self._stage_lock:
            for k in targets:
                self._stage_reasons.pop(k, None)
                self._stage_files.pop(k, None)
        if targets or jobs:
            trim_host_memory()
        self._write_node()
        self._release_intent(model, state.host_id(self.node), intent_id)
        versions = sorted(k.rpartition("@")[2] for k in targets)
        if targets:
            self._node_event("unstaged", model, reason or "unstaged", {"versions": versions, "bytes_freed": freed})
        return {"model": model, "node": self.node, "versions": versions, "bytes_freed": freed,
                "noop": not targets and not jobs, "host_cache": self._cache_figures()}

    # --- infer ------------------------------------------------------------------------------------
    def infer(self, g: GpuSlot, model: str, inputs: Any = None, *, version: str | None = None,
              seed: int = 0) -> dict[str, Any]:
        """One forward pass on a ready replica; `inputs`: None (the first warmup shape), a spec
        {"shape", "dtype", "high"}, or nested lists of numbers."""
        with g.lock:
            cands = [s for s in g.replicas.values()
                     if s.record.model == model and (not version or s.record.version == version)]
            ready = [s for s in cands if s.record.state == "ready" and s.module is not None]
            if not ready:
                seen = ", ".join(f"{s.record.version}: {s.record.state}" for s in cands) or "absent"
                raise NotResident(f"{model}{'@' + version if version else ''} is not resident on {g.id} ({seen}); "
                                  "preload it first")
            s = max(ready, key=lambda x: x.record.since)
            s.record.in_flight += 1
            module = s.module
            rec = replace(s.record)
        try:
            entry = self.entry(rec.model, rec.version)
            x = self._infer_input(entry, inputs, g, module, seed)
            t0 = time.perf_counter()
            with torch.inference_mode():
                y = module(x)
            g.device.synchronize()
            latency = time.perf_counter() - t0
            summary = summarize(y)
        except WorkerError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise BadRequest(f"infer on {rec.model}@{rec.version} on {g.id} failed: {type(exc).__name__}: {exc}") \
                from None
        finally:
            with g.lock:
                s.record.in_flight -= 1
                s.record.last_used = time.time()
        return {"model": rec.model, "version": rec.version, "gpu": g.id, "latency_ms": round(latency * 1000, 3),
                "latency_seconds": latency, "input": {"shape": list(x.shape), "dtype": str(x.dtype)[6:]},
                "output": summary}

    def _infer_input(self, entry: ModelEntry, inputs: Any, g: GpuSlot, module: torch.nn.Module | None,
                     seed: int) -> torch.Tensor:
        base = entry.warmup[0]
        high = int(getattr(module, "vocab_size", 2) or 2)
        if inputs is None:
            return make_input(base, g.device.torch_device, default_high=high, seed=seed)
        if isinstance(inputs, dict):
            shape = inputs.get("shape", list(base.shape))
            dtype = inputs.get("dtype", base.dtype)
            if not (isinstance(shape, list) and shape and all(isinstance(d, int) and d > 0 for d in shape)):
                raise BadRequest(f"inputs shape {shape!r} must be a list of positive integers")
            if dtype not in TORCH_INPUT_DTYPES:
                raise BadRequest(f"inputs dtype {dtype!r} is not one of {', '.join(TORCH_INPUT_DTYPES)}")
            if math.prod(shape) > MAX_INFER_ELEMENTS:
                raise BadRequest(f"inputs of shape {shape} exceed {MAX_INFER_ELEMENTS} elements")
            spec = WarmupInput(tuple(shape), dtype, inputs.get("high", base.high))
            return make_input(spec, g.device.torch_device, default_high=high, seed=seed)
        if isinstance(inputs, list):
            try:
                x = torch.tensor(inputs, dtype=TORCH_INPUT_DTYPES[base.dtype])
            except (TypeError, ValueError, RuntimeError) as exc:
                raise BadRequest(f"inputs cannot be read as a {base.dtype} tensor: {exc}") from None
            if x.numel() > MAX_INFER_ELEMENTS:
                raise BadRequest(f"inputs exceed {MAX_INFER_ELEMENTS} elements")
            return x.to(g.device.torch_device)
        raise BadRequest("inputs must be null, a {shape, dtype, high} table, or nested lists of numbers")

    # --- lifecycle --------------------------------------------------------------------------------
    def replicas(self, g: GpuSlot) -> list[state.Replica]:
        with g.lock:
            return [replace(s.record) for s in g.replicas.values()]

    def forget_queued(self, g: GpuSlot, task_id: str) -> None:
        """Drop the `pending` placeholder a preload task queued for a load slot, when that task is dropped
        (stale) and no other task waits on it: it must not linger as a load that will never come."""
        with g.lock:
            found = [(k, s) for k, s in g.replicas.items() if s.queued and s.task_ids == {task_id}]
            for k, s in found:
                del g.replicas[k]
                s.done.set()
        for _, s in found:
            self._drop_published(g, s.record.model, s.record.version)

    def cancel_loads(self, reason: str) -> int:
        """Ask every load in progress to stop (each fails with Cancelled, releasing its intent); returns how
        many were asked. A warm shutdown then waits seconds, not for whole models to finish loading."""
        n = 0
        for g in self.gpus.values():
            with g.lock:
                for s in g.replicas.values():
                    if s.record.state in IN_FLIGHT and not s.cancel and not s.queued:
                        s.cancel, s.cancel_reason = True, reason
                        n += 1
        return n

    def shutdown(self, reason: str = "worker shutting down") -> None:
        """Cancel loads in progress, drop every replica and take this worker's GPUs out of the fleet
        (only those it claimed: a worker refused a GPU must not erase the live owner's records)."""
        for g in self.gpus.values():
            if g.id not in self.claimed:
                continue
            with g.lock:
                for s in g.replicas.values():
                    if s.record.state in IN_FLIGHT:
                        s.cancel, s.cancel_reason = True, reason
                        continue
                    s.module = None
            with g.publish_lock:
                try:
                    pipe = self.r.pipeline(transaction=True)
                    pipe.delete(keys.gpu(g.id), keys.replicas(g.id))
                    pipe.execute()
                except redis.RedisError as exc:
                    log.warning("could not remove %s from the fleet: %s", g.id, exc)
        if self.claimed:
            # The host cache goes with the process: nothing staged here can be promoted any more.
            with self._stage_lock:
                for j in self._stages.values():
                    j.cancel, j.cancel_reason = True, reason
            with self._node_publish_lock:
                self._node_closed = True
                try:
                    self.r.delete(keys.host_cache(self.node), keys.staged(self.node))
                except redis.RedisError as exc:
                    log.warning("could not remove the host cache of %s: %s", self.node, exc)


def _fingerprint(weights: Path | str) -> dict[str, tuple[int, int]] | None:
    """Size and mtime of every weight file; None when they cannot be listed (then nothing is compared)."""
    try:
        return {str(f): (st.st_size, st.st_mtime_ns) for f in weight_files(weights) for st in [f.stat()]}
    except (SafetensorsError, OSError):
        return None


def _args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())
