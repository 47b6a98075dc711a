"""What a worker process holds on its GPUs, and the preload / evict / infer operations on it.

`NodeWorker` is the worker without Celery: one per process, one `LocalGpu` per device. The Celery tasks
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
- The node's host cache (issue 4's staging tier, `gpu_worker.host_cache.HostCache`): `stage` reads a model's
  weights into host memory (no device memory), `unstage` drops them; a preload of a staged model promotes
  it from there (no storage I/O) and reports `source: "host"`. Staged models are node-level records
  (keys.staged(node), keys.host_cache(node)), published at once and with every heartbeat.
- Every replica is hosted by a runtime (gpu_worker/runtimes: `torch`, `transformers`, `vllm`, the catalog's
  `runtime`): the worker reserves the runtime's required bytes, then commits what it measured once loaded
  (a footprint past the GPU's free budget fails the replica and releases it). A replica served over HTTP
  publishes its `endpoint`. The heartbeat asks each ready runtime whether it died (an engine process that
  exited): that replica goes `failed` with the engine's reason and is released. Shutdown releases every
  runtime, so no engine outlives its worker.
"""


from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import redis

from gpu_worker.devmem import DeviceArena
from gpu_worker.errors import BadRequest
from gpu_worker.held import LocalGpu, LocalReplica, StageJob, WorkerOptions
from gpu_worker.host_cache import HostCache
from gpu_worker.host_cache_ops import HostCacheOps
from gpu_worker.lifecycle import EVICT_WAIT_SECONDS, Lifecycle
from gpu_worker.publication import Publication
from gpu_worker.replica_runtimes import ReplicaRuntimes
from gpu_worker.runtimes.engine_records import EngineRecords
from gpu_worker.runtimes.torch_module import make_input, summarize
from gpu_worker.sleeping_engines import Sleeper, SleepingEngines
from gpu_worker.stage_book import StageBook
from gpu_worker.worker_catalog import CatalogReload
from prewarm import keys
from prewarm.catalog_entries import Catalog
from prewarm.config import DeviceSpec
from prewarm.domain import states as rs

__all__ = ["EVICT_WAIT_SECONDS", "LocalGpu", "LocalReplica", "NodeWorker", "StageJob", "WorkerOptions",
           "make_input", "summarize"]

log = logging.getLogger("prewarm.worker")


class NodeWorker(CatalogReload, Publication, Lifecycle, ReplicaRuntimes, HostCacheOps, SleepingEngines):
    """Every GPU this process serves; the operations behind the Celery tasks. Its rooms: the catalog
    (worker_catalog.py), publication to Redis (publication.py), the replica lifecycle (lifecycle.py), the
    replicas' runtimes and infer (replica_runtimes.py), the node's host cache (host_cache_ops.py) and vLLM's
    host tier (sleeping_engines.py); what it holds per GPU is in held.py."""

    def __init__(self, r: redis.Redis, catalog_path: Path, node: str, devices: list[DeviceSpec],
                 options: WorkerOptions | None = None, *, worker_id: str | None = None,
                 engine_records: Path | None = None) -> None:
        self.r = r
        self.catalog_path = Path(catalog_path)
        self.node = node
        self.options = options or WorkerOptions()
        self.worker_id = worker_id or f"{node}:{os.getpid()}:{os.urandom(3).hex()}"
        self.started_at = time.time()
        if not devices:
            raise ValueError("a worker needs at least one device")
        self.gpus: dict[str, LocalGpu] = {}
        for spec in devices:
            g = LocalGpu(node, spec, self.worker_id, self.started_at)
            if self.options.cpu_device_arena and g.device.kind == "cpu":
                g.arena = DeviceArena(g.device.total_bytes())  # faulted in now, as a GPU's memory exists
            self.gpus[g.id] = g
        self._by_queue = {g.queue: g for g in self.gpus.values()}
        self.claimed: set[str] = set()  # GPUs this worker holds the claim on (heartbeat.claim_gpus)
        # Engine processes started here are written down there (None: not recorded, nothing reaped).
        self.engine_records = EngineRecords(engine_records) if engine_records is not None else None
        self._catalog: Catalog | None = None
        self._catalog_mtime = -1.0
        self._catalog_error: str | None = None
        self._catalog_lock = threading.Lock()
        # One host cache per node (this process serves the node's devices). Pin only for CUDA devices:
        # page-locking for CPU virtual GPUs would start a CUDA context for nothing.
        self.host_cache = HostCache(self.options.host_cache_bytes, pin=any(d.is_cuda for d in devices))
        self.stages = StageBook()  # stages in progress, staged copies' reasons and file fingerprints
        self._node_publish_lock = threading.Lock()
        self._sleep_lock = threading.Lock()  # guards _sleepers
        self._sleepers: dict[str, Sleeper] = {}  # "model@version" -> its vLLM engine asleep (CUDA host tier)
        self._node_closed = False  # set by shutdown: a stage ending after it must not re-announce the node

    # --- which GPU ---------------------------------------------------------------------------------
    def gpu_for(self, gpu: str | None = None, routing_key: str | None = None) -> LocalGpu:
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

    def shutdown(self, reason: str = "worker shutting down") -> None:
        """Cancel loads in progress, drop every replica and take this worker's GPUs out of the fleet
        (only those it claimed: a worker refused a GPU must not erase the live owner's records)."""
        for g in self.gpus.values():
            with g.lock:
                for s in g.replicas.values():
                    if s.record.state in rs.IN_FLIGHT:
                        s.cancel, s.cancel_reason = True, reason  # a loading engine is stopped by its load
            # Every ready replica's runtime goes now: an engine process stops with its worker.
            self.release_runtimes(g)
        self.stop_sleepers()
        for g in self.gpus.values():
            if g.id not in self.claimed:
                continue
            with g.publish_lock:
                try:
                    pipe = self.r.pipeline(transaction=True)
                    pipe.delete(keys.gpu(g.id), keys.replicas(g.id))
                    pipe.execute()
                except redis.RedisError as exc:
                    log.warning("could not remove %s from the fleet: %s", g.id, exc)
        if self.claimed:
            # The host cache goes with the process: nothing staged here can be promoted any more.
            self.stages.cancel(lambda _: True, reason)
            with self._node_publish_lock:
                self._node_closed = True
                try:
                    self.r.delete(keys.host_cache(self.node), keys.staged(self.node))
                except redis.RedisError as exc:
                    log.warning("could not remove the host cache of %s: %s", self.node, exc)


