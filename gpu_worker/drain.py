"""The worker's side of a drain (prewarm.services.drain): empty this node, then exit 0.

It begins on SIGTERM (a rolling update, a pod deleted: the pod's preStop has usually begun it already with
`prewarm drain "$NODE_NAME"`) or when the node's drain record says "draining" (`prewarm drain NODE`, the
API). Then:
1. the node is marked draining (so it takes no new preloads) and the leader scheduler is woken: its drain
   round loads a replacement elsewhere for each ready replica here that still has demand;
2. the worker keeps serving — its Celery consumer runs on, so infer reaches its ready replicas — and waits
   until none of its replicas needs a home (each one's replacement is ready elsewhere), or the grace
   (PREWARM_DRAIN_GRACE) ends; it does not wait when nobody can place a replacement (no scheduler leads,
   or no other GPU takes loads);
3. it evicts its ready replicas (evict kind "drain", through the one dispatch path, onto its own queues),
   marks the node drained (a `drained` event) and stops its consumer: the process exits 0.
A drain begun by the record and undone (`prewarm undrain`) before step 3 ends: the worker serves on. One
begun by SIGTERM goes on to the end: the process is being stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from gpu_worker.residency import NodeWorker
from prewarm import keys, state
from prewarm.dispatch import Dispatcher, Order
from prewarm.domain import states as rs
from prewarm.domain.action_kinds import DRAIN
from prewarm.services import drain as service
from prewarm.store import drains

log = logging.getLogger("prewarm.worker")

EVICT_WAIT_S = 60.0  # the longest the drain waits for its evicts to run (an infer in flight finishing first)


class NodeDrain:
    """One node's drain in its worker process. `dispatcher`: makes the Dispatcher the evicts go through;
    `done`: called once the node is drained (it stops the consumer)."""

    def __init__(self, worker: NodeWorker, *, grace_s: float, poll_s: float, dispatcher: Callable[[], Dispatcher],
                 done: Callable[[], None]) -> None:
        self.worker = worker
        self.grace_s = grace_s
        self.poll_s = poll_s
        self._dispatcher = dispatcher
        self._done = done
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.by_signal = False
        self.finished = threading.Event()  # the node is drained (or the drain gave up): the process may stop
        self._stop_watch = threading.Event()
        self._watching = False

    # --- how a drain begins -------------------------------------------------------------------------
    def on_signal(self) -> None:
        """SIGTERM: begin the drain (or carry on with the one under way, now to the end)."""
        with self._lock:
            self.by_signal = True
        self.begin("SIGTERM: the worker was asked to stop (a rolling update, a pod deleted, a node drained)")

    def begin(self, reason: str) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, args=(reason,), name="prewarm-drain", daemon=True)
            self._thread.start()

    def watch(self) -> NodeDrain:
        """Begin the drain when the node's record says draining (checked every poll_s, in a daemon thread
        started once, however often the consumer is (re)started)."""
        with self._lock:
            if self._watching:
                return self
            self._watching = True

        def run() -> None:
            while not self._stop_watch.wait(self.poll_s):
                try:
                    d = drains.get(self.worker.r, self.worker.node)
                except redis.RedisError:
                    continue  # Redis restarting: the next look finds the record, or not
                if d is not None and d.draining and not self.finished.is_set():
                    self.begin(f"{d.actor} drain: {d.reason}")

        threading.Thread(target=run, name="prewarm-drain-watch", daemon=True).start()
        return self

    def stop_watching(self) -> None:
        self._stop_watch.set()

    # --- the drain ----------------------------------------------------------------------------------
    def _run(self, reason: str) -> None:
        w = self.worker
        started = time.monotonic()
        deadline = started + self.grace_s
        try:
            service.begin(w.r, w.node, actor="worker", reason=reason, grace_s=self.grace_s,
                          maxlen=w.options.event_log_max)
        except service.UnknownNode:
            pass  # not announced yet, or already out of the fleet: nothing is placed here, evict and stop
        except redis.RedisError as exc:
            log.warning("drain: could not mark %s draining: %s", w.node, exc)
        log.info("drain of %s begun (%s): waiting up to %.0f s for replacements elsewhere", w.node, reason,
                 self.grace_s)
        try:
            if not self._wait_for_homes(deadline):
                return  # undrained: serve on
            evicted = self._evict_all(min(EVICT_WAIT_S, max(5.0, deadline - time.monotonic())))
            drains.finish(w.r, w.node, worker=w.worker_id, evicted=evicted, now=time.time(),
                          maxlen=w.options.event_log_max)
            log.info("drain of %s done in %.1f s: %d replica(s) evicted; stopping", w.node,
                     time.monotonic() - started, evicted)
        except Exception:  # noqa: BLE001 - a failed drain must still end the process it was asked to end
            log.exception("drain of %s failed; stopping anyway", w.node)
        self.finished.set()
        self._done()

    def _wait_for_homes(self, deadline: float) -> bool:
        """Wait until no replica here needs a home, nobody can give it one, or the grace ends: True. False:
        the drain was undone (`prewarm undrain`) and it was not begun by SIGTERM."""
        w = self.worker
        what = ""
        while True:
            try:
                fleet = state.read_fleet(w.r, include_stale=False)
                if not self.by_signal and w.node not in service.draining_nodes(fleet):
                    log.info("drain of %s undone: serving on", w.node)
                    return False
                left = service.needs(w.r, w.catalog(), fleet, time.time(), {w.node})
                if not left:
                    return True
                what = ", ".join(f"{x.model}@{x.version} ({x.why})" for x in left)
                if not w.r.exists(keys.LEADER_LOCK):
                    log.warning("drain: no scheduler leads, nobody places a replacement for %s: evicting now", what)
                    return True
                if not fleet.placeable():
                    log.warning("drain: no other GPU takes loads, %s cannot move: evicting now", what)
                    return True
            except redis.RedisError as exc:
                log.warning("drain: cannot read the fleet (%s); trying again", exc)
            if time.monotonic() >= deadline:
                log.warning("drain: grace (%.0f s, PREWARM_DRAIN_GRACE) over; evicting now%s", self.grace_s,
                            f" although no replacement is ready for {what}" if what else "")
                return True
            time.sleep(self.poll_s)

    def _ready_here(self) -> list[tuple[str, str, str]]:
        """(model, version, gpu id) of this worker's ready replicas."""
        out = []
        for g in self.worker.gpus.values():
            with g.lock:
                out += [(s.record.model, s.record.version, g.id) for s in g.replicas.values()
                        if s.record.state == rs.READY]
        return out

    def _evict_all(self, wait_s: float) -> int:
        """Evict this worker's ready replicas through its own queues (a load in progress is cancelled by the
        shutdown that follows); the evicts sent. Waits up to `wait_s` for them to run."""
        w = self.worker
        held = self._ready_here()
        if not held:
            return 0
        fleet = state.read_fleet(w.r, include_stale=False)
        gpus = {g.id: g for g in fleet.alive() if g.id in w.gpus}
        orders = [Order("evict", m, v, gpus[gid], "worker", f"drain: {w.node} drained, its replacements placed",
                        {"node": w.node}, DRAIN, result=False) for m, v, gid in held if gid in gpus]
        sent = sum(1 for d in self._dispatcher().send_many(orders) if not isinstance(d, Exception) and d.sent)
        end = time.monotonic() + wait_s
        while self._ready_here() and time.monotonic() < end:
            time.sleep(0.05)
        return sent
