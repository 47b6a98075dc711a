"""NodeWorker's publication to Redis (mixed into gpu_worker.residency.NodeWorker): replica records, the
GPU inventory and the heartbeat, the node's host cache record, events and intent release.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

import redis

from gpu_worker.held import LocalGpu, LocalReplica, WorkerOptions
from gpu_worker.host_cache import HostCache
from gpu_worker.stage_book import StageBook
from prewarm import events, keys, state
from prewarm.domain import states as rs

log = logging.getLogger("prewarm.worker")


class Publication:
    """Writes what the worker holds to Redis; every write is one owner's (publish locks), so a snapshot
    is never overtaken by an older one."""

    r: redis.Redis
    node: str
    worker_id: str
    options: WorkerOptions
    gpus: dict[str, LocalGpu]
    host_cache: HostCache
    stages: StageBook
    _node_publish_lock: threading.Lock
    _node_closed: bool

    def publish(self, g: LocalGpu, s: LocalReplica) -> None:
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

    def _write_gpu(self, g: LocalGpu) -> None:
        """Refresh the GPU's inventory hash alone (the replicas hash is written separately)."""
        info = state.gpu_info(g.gpu_record(self.options.heartbeat_seconds))
        pipe = self.r.pipeline(transaction=True)
        pipe.sadd(keys.GPUS, g.id)
        pipe.hset(keys.gpu(g.id), mapping=info)
        pipe.pexpire(keys.gpu(g.id), int(self.options.heartbeat_ttl * 1000))
        pipe.execute()

    def heartbeat(self) -> None:
        """Announce every GPU with its full replica set; expire old failed records."""
        now = time.time()
        for g in self.gpus.values():
            self.check_runtimes(g)  # an engine that died while ready is failed before we announce it
            with g.publish_lock:
                with g.lock:
                    for k, s in list(g.replicas.items()):
                        age = now - s.record.since
                        if (s.record.state == rs.FAILED and age > self.options.failed_retention_seconds) or \
                                (s.queued and age > self.options.queued_retention_seconds):
                            del g.replicas[k]
                    for tid, at in list(g.cancelled_tasks.items()):
                        if now - at > 3600:
                            del g.cancelled_tasks[tid]
                    reps = [replace(s.record) for s in g.replicas.values()]
                state.write_heartbeat(self.r, g.gpu_record(self.options.heartbeat_seconds), reps,
                                      self.options.heartbeat_ttl)
        self.check_sleepers()
        self._write_node()

    def node_state(self) -> tuple[state.Node, list[state.Staged]]:
        """The node's host cache inventory and staged models, as published."""
        cache = self.host_cache
        entries = cache.entries()
        used = cache.used_bytes
        staged = self.stages.published({e.key for e in entries}, lambda reasons: [
            state.Staged(model=m, version=v, node=self.node, state=rs.STAGED, bytes=e.nbytes, total_bytes=e.nbytes,
                         progress=1.0, value=e.value, staged_at=e.staged_at, stage_seconds=round(e.stage_seconds, 4),
                         pinned=e.pinned, promotions=e.promotions, last_promoted_at=e.last_promoted_at,
                         reason=reasons.get(e.key))
            for e in entries for m, _, v in [e.key.rpartition("@")]])
        staged += self.sleeping_records()  # vLLM engines asleep (their host tier on CUDA)
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

    def _drop_published(self, g: LocalGpu, model: str, version: str) -> None:
        with g.publish_lock:
            try:
                state.drop_replica(self.r, g.id, model, version)
                self._write_gpu(g)
            except redis.RedisError as exc:
                log.warning("could not unpublish %s on %s: %s", model, g.id, exc)

    def _event(self, kind: str, model: str, g: LocalGpu, reason: str, numbers: dict[str, Any]) -> None:
        try:
            events.record(self.r, kind, "worker", model=model, gpu=g.id, reason=reason, numbers=numbers,
                          maxlen=self.options.event_log_max)
        except redis.RedisError as exc:
            log.warning("could not record event %s %s: %s", kind, model, exc)

    def _release_intent(self, model: str, g: LocalGpu | str, intent_id: str) -> None:
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

