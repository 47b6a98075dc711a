"""What a worker process holds per GPU: its options, its replicas and the stage jobs (what it holds, as
opposed to a GPU's load slots, which are how many loads it runs at once).

`LocalGpu` is one device this process serves, with its replicas (`LocalReplica`: the published record plus the
module and cancel flags only this process holds); `StageJob` is a stage into the node's host cache in
progress. The operations on them are NodeWorker's (gpu_worker/residency.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpu_worker.device import Device, make_device
from gpu_worker.devmem import DeviceArena
from gpu_worker.runtimes import Runtime
from prewarm import state
from prewarm.config import DeviceSpec, Settings
from prewarm.domain import states as rs

# A queued preload's task retries every RETRY_BUSY_SECONDS (gpu_worker.tasks); one not seen for this long has
# stopped coming back (dropped, or its worker thread stalled) and no longer holds its place in the queue.
QUEUED_ALIVE_S = 10.0


@dataclass
class WorkerOptions:
    heartbeat_seconds: float = 2.0
    heartbeat_ttl: float = 10.0
    event_log_max: int = 5000
    warmup_min_passes: int = 3  # the first pass is cold (allocator, kernels); stability needs two more
    warmup_max_passes: int = 10
    warmup_tolerance: float = 0.15  # last two passes within 15% of each other: latency is stable
    warmup_max_seconds: float = 5.0  # per input, a hard ceiling over min_passes (runtimes/warmup.py)
    progress_publish_seconds: float = 0.2
    max_loads_per_gpu: int = 2  # concurrent loads on one GPU; more preloads wait in the queue (see Busy)
    failed_retention_seconds: float = 600.0
    queued_retention_seconds: float = 900.0  # a queued preload's placeholder whose task never came back
    load_threads: int | None = None
    # Paces the load phase to at most this many bytes/s (reporting and completion; the reader threads are
    # not slowed). For demos that want to watch progress and for tests that must catch a load in flight.
    load_pace_bytes_per_s: float | None = None
    # The node's host cache budget (Settings.host_cache, PREWARM_HOST_CACHE); None: a quarter of physical memory.
    host_cache_bytes: int | None = None
    # A CPU virtual GPU's memory as a GPU's: one pre-faulted arena of its budget that loads write into
    # (gpu_worker/devmem.py); evicted bytes go back to the arena, not to the OS. Off: new memory per load.
    cpu_device_arena: bool = False

    @classmethod
    def from_settings(cls, s: Settings) -> WorkerOptions:
        from gpu_worker.host_cache import default_host_cache_bytes

        return cls(heartbeat_seconds=s.heartbeat_seconds, heartbeat_ttl=s.heartbeat_ttl,
                   event_log_max=s.event_log_max,
                   warmup_max_passes=s.warmup_max_passes,
                   warmup_max_seconds=s.warmup_max_seconds,
                   max_loads_per_gpu=s.max_loads_per_gpu,
                   failed_retention_seconds=s.failed_retention_seconds,
                   load_threads=s.load_threads,
                   load_pace_bytes_per_s=s.load_pace_bytes_per_s,
                   host_cache_bytes=default_host_cache_bytes(s.host_cache) if s.host_cache else None,
                   cpu_device_arena=s.cpu_device_arena)


@dataclass
class StageJob:
    """A stage into the host cache in progress: its published record and how to cancel it."""

    record: state.Staged
    done: threading.Event = field(default_factory=threading.Event)
    cancel: bool = False
    cancel_reason: str = ""
    error: str | None = None


@dataclass
class LocalReplica:
    """One replica on one GPU: its published record plus what only this process holds."""

    record: state.Replica
    runtime: Runtime | None = None  # the replica's host once ready (gpu_worker/runtimes)
    done: threading.Event = field(default_factory=threading.Event)  # set when a load ends (ready or failed)
    cancel: bool = False
    cancel_reason: str = ""
    warmup: list[dict[str, Any]] = field(default_factory=list)
    # A placeholder for a preload waiting in the queue for a free load slot: shown `pending`, owns nothing,
    # taken over by the first preload of it that may run.
    queued: bool = False
    task_ids: set[str] = field(default_factory=set)  # preload tasks waiting on this replica (see evict)
    # A queued preload's place in the GPU's queue: its priority (prewarm.priority.rank; the highest of the
    # tasks waiting on it), and when a task of it last asked for a slot (a placeholder whose task stopped
    # coming back does not hold up the queue).
    priority: int = 1
    queued_seen: float = 0.0


    @property
    def module(self) -> Any:
        """A torch-hosted replica's module (None for another runtime, or before ready)."""
        return getattr(self.runtime, "module", None)

class LocalGpu:
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
        self.replicas: dict[str, LocalReplica] = {}  # "model@version" -> LocalReplica
        self.cancelled_tasks: dict[str, float] = {}  # preload task id -> when an evict cancelled it
        # A CPU virtual GPU's pre-faulted memory, when WorkerOptions.cpu_device_arena (see NodeWorker).
        self.arena: DeviceArena | None = None

    def active_loads(self) -> int:
        """Loads running now (placeholders of queued preloads not counted). Call with `lock` held."""
        return sum(x.record.state in rs.IN_FLIGHT and not x.queued for x in self.replicas.values())

    def queued_ahead(self, key: str, rank: int, queued_at: float, now: float, skip: set[str]) -> str | None:
        """The key of a queued preload that goes before `key` (priority `rank`, queued at `queued_at`) for
        this GPU's next free load slot: a higher priority, or the same one queued earlier; None when `key`
        is next. Placeholders in `skip` (waiting for a stage, not for a slot) and those whose task has not
        asked for a slot in QUEUED_ALIVE_S are passed over. Call with `lock` held."""
        best: tuple[int, float, str] | None = None
        for k, x in self.replicas.items():
            if k == key or not x.queued or k in skip or now - x.queued_seen > QUEUED_ALIVE_S:
                continue
            if x.priority > rank or (x.priority == rank and x.record.created_at < queued_at):
                cand = (-x.priority, x.record.created_at, k)
                if best is None or cand < best:
                    best = cand
        return None if best is None else best[2]

    def gpu_record(self, heartbeat_seconds: float) -> state.Gpu:
        """The GPU's inventory record now; it carries the beat period so readers can tell a late beat."""
        inv = self.device.inventory()
        return state.Gpu(id=self.id, node=self.node, device=self.spec.device, queue=self.queue,
                         total_bytes=inv.total_bytes, used_bytes=inv.used_bytes, free_bytes=inv.free_bytes,
                         last_heartbeat=time.time(), worker=self.worker_id, started_at=self.started_at,
                         kind=self.device.kind, heartbeat_seconds=heartbeat_seconds)

    def residents(self) -> list[str]:
        with self.lock:
            return [k for k, s in self.replicas.items() if s.record.state != rs.FAILED]

