"""The worker's heartbeat and its claim on its GPUs.

Every `heartbeat_seconds` the worker rewrites each GPU's inventory and full replica set with a TTL of
`heartbeat_ttl` (state.write_heartbeat): a worker that dies stops refreshing them and its GPUs leave the
fleet when the TTL runs out. Each GPU also carries a claim (keys.worker_lock) naming the one live worker
process that serves it, refreshed with the heartbeat. A starting worker waits for a previous holder's
claim to lapse (a crashed worker's does within the TTL), then clears the GPU's stale records and intents
and stops any engine process a previous worker recorded for that GPU and left running.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import redis

from gpu_worker import health
from gpu_worker.residency import NodeWorker
from prewarm import keys, state

log = logging.getLogger("prewarm.worker")

# Refresh the claim if it is still ours (or gone); never take over another live worker's.
_REFRESH = """
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class ClaimTaken(RuntimeError):
    """Another live worker serves this GPU."""


def claim_gpus(worker: NodeWorker, *, wait: float | None = None) -> None:
    """Claim every GPU for this worker, waiting up to `wait` seconds (default: 1.5 TTLs) for a previous
    worker's claim to expire, then clear the GPU's stale replicas and intents."""
    ttl_ms = int(worker.options.heartbeat_ttl * 1000)
    deadline = time.monotonic() + (wait if wait is not None else 1.5 * worker.options.heartbeat_ttl + 1)
    for g in worker.gpus.values():
        announced = False
        while not worker.r.set(keys.worker_lock(g.id), worker.worker_id, nx=True, px=ttl_ms):
            holder = worker.r.get(keys.worker_lock(g.id))
            if time.monotonic() > deadline:
                raise ClaimTaken(f"GPU {g.id} is served by another live worker ({holder.decode() if holder else '?'}); "
                                 "stop it first, or give this node another PREWARM_NODE")
            if not announced:
                log.warning("GPU %s is claimed by %s; waiting for that claim to lapse", g.id,
                            holder.decode() if holder else "?")
                announced = True
            time.sleep(0.2)
        worker.claimed.add(g.id)
        state.clear_gpu(worker.r, g.id)
        worker.reap_engines(g)  # what a previous worker on this GPU left running goes before we announce
        log.info("claimed %s (queue %s) as %s", g.id, g.queue, worker.worker_id)
    # The node's host cache lives in this process: a previous worker's staged records are stale.
    state.clear_node(worker.r, worker.node)


def release_claims(worker: NodeWorker) -> None:
    for g in worker.gpus.values():
        worker.claimed.discard(g.id)
        try:
            worker.r.eval(_RELEASE, 1, keys.worker_lock(g.id), worker.worker_id)
        except redis.RedisError as exc:
            log.warning("could not release the claim on %s: %s", g.id, exc)


class Heartbeat:
    """A daemon thread beating every `heartbeat_seconds` until stopped; with `health`, it rewrites that
    file (gpu_worker/health.py) at every beat for the worker's probes."""

    def __init__(self, worker: NodeWorker, *, announce: bool = True, health_file: Path | None = None) -> None:
        self.worker = worker
        self.health_file = health_file
        self.beat_ok_at: float | None = None
        self.stopping = False  # set when the worker starts shutting down: no longer ready
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prewarm-heartbeat", daemon=True)
        self.beats = 0
        # Claims are kept from the start; the GPUs are announced (join the fleet) only once tasks can be
        # consumed from their queues, so nothing routes to a worker that is still starting.
        self.announcing = threading.Event()
        if announce:
            self.announcing.set()

    def announce(self) -> None:
        """Start announcing the GPUs (now, and at every beat)."""
        self.announcing.set()
        self.beat()
        self.write_health()  # ready now, not at the next beat

    def beat(self) -> None:
        w = self.worker
        ttl_ms = int(w.options.heartbeat_ttl * 1000)
        for g in w.gpus.values():
            if not w.r.eval(_REFRESH, 1, keys.worker_lock(g.id), w.worker_id, ttl_ms):
                holder = w.r.get(keys.worker_lock(g.id))
                log.error("GPU %s is now claimed by another worker (%s): two workers serve one GPU", g.id,
                          holder.decode() if holder else "?")
        if self.announcing.is_set():
            w.heartbeat()
            self.beat_ok_at = time.time()
        self.beats += 1

    def write_health(self) -> None:
        if self.health_file is None:
            return
        o = self.worker.options
        try:
            health.write(self.health_file, health.Health(
                pid=os.getpid(), announced=self.announcing.is_set(), stopping=self.stopping,
                beat_at=time.time(), beat_ok_at=self.beat_ok_at, heartbeat_seconds=o.heartbeat_seconds,
                heartbeat_ttl=o.heartbeat_ttl))
        except OSError as exc:  # a full or read-only data folder must not stop the heartbeat
            log.warning("could not write the health file %s: %s", self.health_file, exc)

    def _run(self) -> None:
        while not self._stop.wait(self.worker.options.heartbeat_seconds):
            try:
                self.beat()
            except redis.RedisError as exc:  # Redis restarting: the next beat re-announces everything
                log.warning("heartbeat failed: %s", exc)
            except Exception:  # noqa: BLE001 - the heartbeat must outlive any one bad beat
                log.exception("heartbeat failed")
            self.write_health()

    def start(self) -> Heartbeat:
        self.beat()
        self.write_health()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.write_health()
