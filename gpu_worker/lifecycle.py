"""The replica lifecycle on one GPU (mixed into gpu_worker.residency.NodeWorker): preload (reserve, load,
warm, ready or failed), evict (cancelling a load in flight), infer, and the queue of waiting preloads.
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
    BadRequest,
    Busy,
    Cancelled,
    DoesNotFit,
    LoadFailed,
    NotResident,
    UnknownModel,
    WorkerError,
)
from gpu_worker.held import LocalGpu, LocalReplica, WorkerOptions
from gpu_worker.host_cache import HostCache
from gpu_worker.runtimes import ReplicaSpec, Runtime, TokenWarmup
from gpu_worker.runtimes.engine_records import EngineLeftRunning, EngineRecords
from gpu_worker.runtimes.errors import AdapterRefused
from gpu_worker.runtimes.torch_module import TorchRuntime
from gpu_worker.runtimes.warmup import WarmupPolicy
from gpu_worker.stage_book import StageBook
from prewarm import priority as priorities
from prewarm import state
from prewarm.catalog_entries import ADAPTER_RUNTIME, ModelEntry, TokenWarmupInput
from prewarm.config import format_bytes
from prewarm.domain import states as rs
from prewarm.engines import DEFAULT_KV_CACHE_BYTES
from prewarm.store.ready import replica_ready

log = logging.getLogger("prewarm.worker")

EVICT_WAIT_SECONDS = 10.0
# What `infer` sends a replica when the task gives no inputs (torch: the first warmup shape).
DEFAULT_REQUESTS: dict[str, dict[str, Any]] = {"transformers": {"prompt_tokens": 16, "batch": 1},
                                               "vllm": {"prompt": "Hello", "max_tokens": 8, "temperature": 0.0},
                                               ADAPTER_RUNTIME: {"prompt": "Hello", "max_tokens": 8, "temperature": 0.0}}  # how long a preload that does not fit waits for an evict in flight on its GPU


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
    """preload / evict / infer on a LocalGpu; publication, catalog and host cache are the other mixins'."""

    r: redis.Redis
    node: str
    options: WorkerOptions
    gpus: dict[str, LocalGpu]
    host_cache: HostCache
    stages: StageBook
    engine_records: EngineRecords | None
    take_sleeper: Callable[[str, LocalGpu], Any]  # sleeping_engines.SleepingEngines

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
            left = _release(rt)  # no tensor, process or port of the failed replica is kept
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
            left = _release(rt)  # an engine stops here: its process group, port and memory go
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
            left = _release(rt)
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
            left = _release(rt)
            if left:
                log.error("shutdown: releasing %s on %s: %s", k, g.id, left)
            g.device.release(k)

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


def _release(rt: Runtime | None) -> str:
    """Release a runtime; '' when nothing of it is left, else what is (ReleaseFailed's message)."""
    if rt is None:
        return ""
    try:
        rt.release()
    except Exception as exc:  # noqa: BLE001 - what is left is reported; the caller's outcome stands
        return f"{type(exc).__name__}: {exc}"
    return ""
