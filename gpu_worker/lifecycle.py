"""The replica lifecycle on one GPU (mixed into gpu_worker.residency.NodeWorker): preload (reserve, load,
warm, ready or failed), evict (cancelling a load in flight), and the queue of waiting preloads. The runtime
a replica gets, and infer through it, are gpu_worker.replica_runtimes'.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from gpu_worker.errors import (
    Busy,
    Cancelled,
    DoesNotFit,
    LoadFailed,
    UnknownModel,
    WorkerError,
)
from gpu_worker.held import LocalGpu, LocalReplica, WorkerOptions
from gpu_worker.replica_runtimes import release_runtime
from gpu_worker.runtimes import Runtime
from gpu_worker.stage_book import StageBook
from prewarm import priority as priorities
from prewarm import state
from prewarm.catalog_entries import ModelEntry
from prewarm.domain import states as rs
from prewarm.store.ready import replica_ready
from prewarm.units import format_bytes

log = logging.getLogger("prewarm.worker")

EVICT_WAIT_SECONDS = 10.0  # how long a preload that does not fit waits for an evict in flight on its GPU


def _level(rank: int) -> str | None:
    """A priority rank as the replica record shows it: its name, None for normal (as the message)."""
    level = priorities.LEVELS[rank]
    return None if level == priorities.DEFAULT else level


class Admission(enum.Enum):
    """How a preload task enters a GPU (Lifecycle._admit): the whole admission rule in four outcomes."""

    NOOP = "noop"    # the model is ready here already: nothing to load
    JOIN = "join"    # a load of it is in flight and this task may wait: its outcome is this one's
    LOAD = "load"    # this task loads it now (a new replica, or a queued one whose turn came)
    QUEUE = "queue"  # no load slot (or staged soon, or others ahead): a `pending` placeholder; the task retries


class Lifecycle:
    """preload / evict on a LocalGpu; the runtimes (replica_runtimes.py), publication, catalog and host cache
    are the other mixins'."""

    r: redis.Redis
    node: str
    options: WorkerOptions
    gpus: dict[str, LocalGpu]
    stages: StageBook

    def preload(self, g: LocalGpu, model: str, version: str | None = None, *, reason: str = "",
                kind: str = "", defer: bool = False, task_id: str | None = None,
                intent_id: str = "", priority: str | None = None) -> dict[str, Any]:
        """Load and warm `model` on GPU `g`; returns the ready replica's figures (see tasks.py).

        With `defer`, raise Busy instead of waiting: when this model is already loading here (its outcome
        will be this one's), or when the GPU runs `max_loads_per_gpu` loads already (the replica then shows
        `pending` until a load slot frees), or when the model is being staged in this node's host cache (it
        is promoted from there once staged, rather than read from storage twice). The Celery task retries
        then, so waiting preloads sit in the queue rather than on the threads inference needs. `task_id`
        lets an evict cancel a waiting preload; `intent_id` (the dispatch's intent) is the intent this preload
        releases when it ends, and lets an evict that superseded it cancel it before it starts.
        `priority` (prewarm.priority; None: normal) orders the preloads queued for this GPU's load slots: a
        free slot goes to the highest priority first, the earliest queued within one.
        """
        try:
            entry = self.entry(model, version)
        except UnknownModel as exc:
            self._fail_unknown(g, model, version, str(exc), intent_id)
            raise
        key = entry.key
        stages = self.stages.keys()
        admitted, s, why = self._admit(g, entry, reason=reason, rank=priorities.rank(priority), defer=defer,
                                       task_id=task_id, intent_id=intent_id, stages=stages)
        if admitted is Admission.QUEUE:
            self.publish(g, s)  # its `pending` placeholder: the router and the planner see it queued
            raise Busy(why)
        if admitted in (Admission.NOOP, Admission.JOIN):
            if admitted is Admission.JOIN:
                s.done.wait()  # the first preload's outcome is this one's
            self._release_intent(entry.id, g, intent_id)
            with g.lock:
                rec = replace(s.record)
            if rec.state != rs.READY:
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
        cut = [i for i, f in enumerate(s.warmup) if f.get("cut_short")]
        note = ""
        if cut:  # the time ceiling stopped these before the minimum passes (runtimes/warmup.py)
            note = (f"; warmup cut short by PREWARM_WARMUP_MAX_SECONDS ({self.options.warmup_max_seconds:g} s) "
                    f"for input(s) #{', #'.join(map(str, cut))}")
            log.warning("%s on %s: %s", key, g.id, note.removeprefix("; "))
        skipped = [i for i, f in enumerate(s.warmup) if f.get("not_warmed")]
        if skipped:  # its memory would have passed the GPU's free bytes (runtimes/warmup_memory.py)
            note += (f"; warmup input(s) #{', #'.join(map(str, skipped))} not warmed: their memory would pass "
                     f"what {g.id} has free")
        self._event("ready", entry.id, g, f"loaded and warmed {key} ({format_bytes(rec.bytes)}, from {rec.source}){note}",
                    {"version": entry.version, "bytes": rec.bytes, "load_seconds": rec.load_seconds,
                     "warmup_seconds": rec.warmup_seconds, "kind": kind, "source": rec.source,
                     **({"warmup_cut_short": cut} if cut else {}),
                     **({"warmup_not_warmed": skipped} if skipped else {})})
        return self._result(rec, s, noop=False)

    def _admit(self, g: LocalGpu, entry: ModelEntry, *, reason: str, rank: int, defer: bool, task_id: str | None,
               intent_id: str, stages: set[str]) -> tuple[Admission, LocalReplica, str]:
        """Which way a preload of `entry` on `g` goes, decided under the GPU's lock (see Admission); with the
        replica's slot, and for QUEUE the Busy message. Raises Cancelled when an evict took it over, Busy when
        a deferred preload finds the model loading already (the task retries; its id joins the slot's)."""
        key, now = entry.key, time.time()
        with g.lock:
            if (task_id and task_id in g.cancelled_tasks) or (intent_id and intent_id in g.cancelled_tasks):
                raise Cancelled(f"preload of {key} on {g.id} was cancelled by an evict while it waited")
            s = g.replicas.get(key)
            if s is not None and s.queued:
                s.priority, s.queued_seen = max(s.priority, rank), now
                rank = s.priority
                s.record.priority = _level(rank)
            staging = key in stages
            ahead = defer and g.queued_ahead(key, rank, s.record.created_at if s is not None else now, now, stages)
            busy = defer and (staging or bool(ahead) or g.active_loads() >= self.options.max_loads_per_gpu)
            if s is not None and s.record.state == rs.READY:
                return Admission.NOOP, s, ""
            if s is not None and s.queued and not busy:
                s.queued = False  # a queued preload's turn: this task loads it
                s.record.reason = s.record.reason or reason or None
                return Admission.LOAD, s, ""
            if s is not None and s.record.state in rs.IN_FLIGHT:  # loading now (or queued while busy)
                if defer:
                    if task_id:
                        s.task_ids.add(task_id)
                    raise Busy(f"{key} is {'queued' if s.queued else 'already loading'} on {g.id}")
                return Admission.JOIN, s, ""
            s = LocalReplica(state.Replica(model=entry.id, version=entry.version, gpu=g.id, state=rs.PENDING,
                                   total_bytes=entry.size_bytes, since=now, created_at=now,
                                   reason=reason or None, priority=_level(rank)), queued=busy, priority=rank,
                     queued_seen=now)
            if task_id:
                s.task_ids.add(task_id)
            g.replicas[key] = s
        if not busy:
            return Admission.LOAD, s, ""
        if staging:
            return Admission.QUEUE, s, f"{key} is being staged on node {self.node}; the preload waits to promote it"
        if ahead:
            return Admission.QUEUE, s, f"{key} is queued on {g.id} behind {ahead} (a higher priority, or queued earlier)"
        return Admission.QUEUE, s, f"{g.id} runs {self.options.max_loads_per_gpu} load(s) already; {key} is queued"

    def _result(self, rec: state.Replica, s: LocalReplica, *, noop: bool) -> dict[str, Any]:
        return {"model": rec.model, "version": rec.version, "gpu": rec.gpu, "state": rec.state,
                "bytes": rec.bytes, "load_seconds": rec.load_seconds, "warmup_seconds": rec.warmup_seconds,
                "warmup": list(s.warmup), "noop": noop, "source": rec.source}

    def _set(self, g: LocalGpu, s: LocalReplica, **changes: Any) -> None:
        with g.lock:
            for k, v in changes.items():
                setattr(s.record, k, v)
            if "state" in changes:
                s.record.since = time.time()
        self.publish(g, s)

    def _check_cancel(self, g: LocalGpu, s: LocalReplica) -> None:
        if s.cancel:
            raise Cancelled(f"preload of {s.record.model}@{s.record.version} on {g.id} was cancelled: "
                            f"{s.cancel_reason or 'evicted while loading'}")

    def _load(self, g: LocalGpu, s: LocalReplica, entry: ModelEntry) -> None:
        key = entry.key
        dev = g.device
        rt = self._runtime(g, entry)
        error: WorkerError | None = None
        try:
            # 1. Cheap checks only (builder, headers, config): bad input fails before a byte is reserved.
            need = rt.required_bytes()
            self._check_cancel(g, s)
            # 2. Reserve what the runtime needs before it allocates any of it.
            self._reserve(g, s, key, need)
            self._set(g, s, state=rs.LOADING, total_bytes=need, bytes=0, progress=0.0, source=_source(rt))
            t0 = time.perf_counter()
            measured = rt.load(self._progress(g, s, rt), lambda: self._check_cancel(g, s))
            # 3. What the runtime really holds, measured, replaces the reservation (if it still fits).
            dev.commit_measured(key, measured)
            load_seconds = time.perf_counter() - t0
            self._check_cancel(g, s)
            self._set(g, s, state=rs.WARMING, bytes=measured, progress=1.0, load_seconds=round(load_seconds, 4),
                      source=_source(rt))
            t1 = time.perf_counter()
            s.warmup = rt.warm(lambda: self._check_cancel(g, s))
            warmup_seconds = time.perf_counter() - t1
            after = rt.measure()
            if after != measured:  # an engine's footprint grows as it warms (caches, graphs)
                dev.commit_measured(key, after)
            with g.lock:
                s.runtime = rt
            self._set(g, s, state=rs.READY, bytes=after, warmup_seconds=round(warmup_seconds, 4), endpoint=rt.endpoint,
                      ready_at=time.time())
            log.info("%s ready on %s (%s): %d bytes, load %.2f s (from %s), warmup %.2f s", key, g.id, rt.name, after,
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
                s.runtime = None
            left = release_runtime(rt)  # no tensor, process or port of the failed replica is kept
            if left:
                log.error("releasing the failed %s on %s: %s", key, g.id, left)
            del rt
            dev.release(key)
            dev.reclaim()
            raise error

    def _progress(self, g: LocalGpu, s: LocalReplica, rt: Runtime) -> Callable[[int, int], None]:
        """The runtime's progress callback: cancel check, published progress (throttled), load pacing."""
        t0 = time.monotonic()
        last = [0.0]
        pace = self.options.load_pace_bytes_per_s

        def progress(done: int, total: int) -> None:
            self._check_cancel(g, s)  # raising here cancels the load
            now = time.monotonic()
            moved = _source(rt) != s.record.source  # a promotion that fell back to storage: say so at once
            if moved or now - last[0] >= self.options.progress_publish_seconds or done == total:
                last[0] = now
                self._set(g, s, bytes=done, progress=round(done / total, 4) if total else 1.0, source=_source(rt))
            if pace:
                wait = done / pace - (time.monotonic() - t0)
                while wait > 0:
                    time.sleep(min(wait, 0.1))
                    self._check_cancel(g, s)
                    wait = done / pace - (time.monotonic() - t0)

        return progress

    def _reserve(self, g: LocalGpu, s: LocalReplica, key: str, need: int) -> None:
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

    def _evict_in_flight(self, g: LocalGpu, key: str) -> bool:
        """An evict intent (claimed by the dispatcher, released by our evict once its bytes are freed) is held
        for a model with a replica on `g` other than `key`."""
        with g.lock:
            models = sorted({x.record.model for k, x in g.replicas.items()
                             if k != key and x.record.state != rs.FAILED})
        try:
            held = state.held_intents(self.r, [(m, g.id) for m in models])
        except redis.RedisError:
            return False
        return any(it.action == "evict" for it in held)

    def _failed(self, g: LocalGpu, s: LocalReplica, entry: ModelEntry, exc: WorkerError, intent_id: str) -> dict[str, Any]:
        msg = str(exc)
        cancelled = isinstance(exc, Cancelled)
        with g.lock:
            s.runtime = None
            if cancelled:
                # An evict cancelled it: the replica is gone, not failed.
                if g.replicas.get(entry.key) is s:
                    del g.replicas[entry.key]
            s.record.state = rs.FAILED
            s.record.error = msg
            s.record.bytes = 0
            s.record.progress = 0.0
            s.record.endpoint = None
            s.record.since = time.time()
        if cancelled:
            self._drop_published(g, entry.id, entry.version)
        else:
            self.publish(g, s)
        self._release_intent(entry.id, g, intent_id)
        self._event("failed", entry.id, g, msg, {"version": entry.version, "cancelled": cancelled})
        log.warning("preload of %s on %s failed: %s", entry.key, g.id, msg)
        raise exc

    def _fail_unknown(self, g: LocalGpu, model: str, version: str | None, msg: str, intent_id: str) -> None:
        v = version or "?"
        rec = state.Replica(model=model, version=v, gpu=g.id, state=rs.FAILED, error=msg, since=time.time(),
                            created_at=time.time())
        s = LocalReplica(rec)
        s.done.set()
        with g.lock:
            key = state.replica_field(model, v)
            if key not in g.replicas or g.replicas[key].record.state == rs.FAILED:
                g.replicas[key] = s
        self.publish(g, s)
        self._release_intent(model, g, intent_id)
        self._event("failed", model, g, msg, {"version": v})

    # --- evict ------------------------------------------------------------------------------------
    def evict(self, g: LocalGpu, model: str, version: str | None = None, *, reason: str = "",
              cancel_timeout: float = 120.0, intent_id: str = "", supersedes: str = "") -> dict[str, Any]:
        """Drop every replica of `model` (of `version` when given) on `g`; idempotent. A load of it in
        progress is cancelled. `supersedes`: the intent id of the preload this evict took over; a preload
        task carrying it that has not started yet is cancelled when it does."""
        # A base's adapters go first, each evicted with its own event and reason: they live in its engine.
        with g.lock:
            bases = {k for k, s in g.replicas.items()
                     if s.record.model == model and (not version or s.record.version == version)}
            hosted = sorted({s.record.model for s in g.replicas.values() if s.record.host in bases})
        for adapter in hosted:
            self.evict(g, adapter, reason=f"its base {model} is being evicted from {g.id}"
                                          + (f" ({reason})" if reason else ""), cancel_timeout=cancel_timeout)
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
                elif s.record.state in rs.IN_FLIGHT:
                    s.cancel = True
                    s.cancel_reason = f"evicted while loading ({reason or 'evict'})"
        freed = 0
        versions: list[str] = []
        for k, s in targets:
            if not s.done.is_set() and s.record.state in rs.IN_FLIGHT:
                s.done.wait(cancel_timeout)
            with g.lock:
                was = s.record.state
                if g.replicas.get(k) is s:
                    if was == rs.READY:
                        s.record.state = rs.EVICTING
                        s.record.since = time.time()
                    del g.replicas[k]
                rt, s.runtime = s.runtime, None
            left = release_runtime(rt)  # an engine stops here: its process group, port and memory go
            if left:
                log.error("evict of %s on %s: %s", k, g.id, left)
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

    # --- lifecycle --------------------------------------------------------------------------------
    def replicas(self, g: LocalGpu) -> list[state.Replica]:
        with g.lock:
            return [replace(s.record) for s in g.replicas.values()]

    def forget_queued(self, g: LocalGpu, task_id: str) -> None:
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
                    if s.record.state in rs.IN_FLIGHT and not s.cancel and not s.queued:
                        s.cancel, s.cancel_reason = True, reason
                        n += 1
        return n


def _source(rt: Runtime) -> str:
    return getattr(rt, "source", "storage")
