"""What `prewarm bench tick` writes before it ticks: catalog, GPUs with replicas, load times, traffic."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis

from prewarm import state, traffic
from prewarm.domain import states as rs
from prewarm.store.ready import replica_ready
from prewarm.units import GIB

GPUS_PER_NODE = 8
LOAD_GIB_S = 2.0  # the load times recorded for resident replicas: storage at ~2 GiB/s, plus noise


@dataclass
class Workload:
    ids: list[str]
    sizes: np.ndarray  # bytes per model
    rates: np.ndarray  # requests per second per model (Zipf over a shuffled order)
    rng: np.random.Generator

    @classmethod
    def make(cls, models: int, rate: float, zipf: float, seed: int) -> Workload:
        rng = np.random.default_rng(seed)
        ids = [f"model-{i:05d}" for i in range(models)]
        # Log-uniform from 0.5 to 32 GiB: many small models, some that fill half a GPU.
        sizes = (2.0 ** rng.uniform(-1, 5, size=models) * GIB).astype(np.int64)
        weights = 1.0 / np.arange(1, models + 1) ** zipf
        rates = rng.permutation(rate * weights / weights.sum())  # popularity unrelated to the id order
        return cls(ids, sizes, rates, rng)

    def write_catalog(self, folder: Path) -> Path:
        from gpu_worker.sized_catalog import write_sized_catalog

        return write_sized_catalog(folder, {m: int(s) for m, s in zip(self.ids, self.sizes, strict=True)},
                                   sparse=True)

    def record(self, r: redis.Redis, start: int, end: int, now: float) -> int:
        """Poisson per-second traffic for [start, end), one record call per minute (as a router's batches
        come: many models, one timestamp each)."""
        done = 0
        for chunk in range(start, end, 60):
            secs = min(60, end - chunk)
            counts = self.rng.poisson(self.rates[:, None], size=(len(self.ids), secs))
            mi, si = np.nonzero(counts)
            events = [(self.ids[m], int(counts[m, s]), float(chunk + s)) for m, s in zip(mi, si, strict=True)]
            done += traffic.record(r, events, now=now)
        return done


@dataclass
class BenchFleet:
    gpus: list[state.Gpu]
    replicas: dict[str, list[state.Replica]] = field(default_factory=dict)  # gpu id -> its replicas

    @classmethod
    def place(cls, w: Workload, n_gpus: int, gpu_bytes: int, now: float) -> BenchFleet:
        """GPUs filled greedily with ready replicas, the most requested models first (one replica per
        ~5 req/s, up to 8), each on the GPU with the most free memory that fits it."""
        gpus = []
        for i in range(n_gpus):
            node, device = f"node-{i // GPUS_PER_NODE:03d}", f"cuda:{i % GPUS_PER_NODE}"
            gpus.append(state.Gpu(id=state.gpu_id(node, device), node=node, device=device,
                                  queue=state.queue_name(node, device), total_bytes=gpu_bytes, used_bytes=0,
                                  free_bytes=gpu_bytes, last_heartbeat=now, worker=f"bench@{node}",
                                  started_at=now - 7200, kind="cuda"))
        fleet = cls(gpus, {g.id: [] for g in gpus})
        free = np.full(n_gpus, gpu_bytes, dtype=np.int64)
        smallest = int(w.sizes.min())
        for m in np.argsort(-w.rates):
            size = int(w.sizes[m])
            room = free.copy()
            for _ in range(min(8, 1 + int(w.rates[m] / 5))):
                i = int(np.argmax(room))  # the most free memory; a GPU holding this model is out (-1)
                if room[i] < size:
                    break
                g, room[i] = gpus[i], -1
                load_s = size / (LOAD_GIB_S * GIB) * float(w.rng.uniform(0.8, 1.25))
                since = now - float(w.rng.uniform(60, 3600))
                fleet.replicas[g.id].append(state.Replica(
                    model=w.ids[m], version="v1", gpu=g.id, state=rs.READY, bytes=size, total_bytes=size,
                    progress=1.0, load_seconds=round(load_s, 3), warmup_seconds=0.2, since=since,
                    created_at=since - load_s, last_used=now - float(w.rng.uniform(0, 30)), source="storage"))
                free[i] -= size
                g.used_bytes += size
                g.free_bytes -= size
            if free.max() < smallest:
                break
        return fleet

    def count(self) -> int:
        return sum(len(x) for x in self.replicas.values())

    def record_loads(self, r: redis.Redis) -> None:
        """Each resident replica's load, recorded as its worker recorded it when it turned ready."""
        for reps in self.replicas.values():
            for x in reps:
                replica_ready(r, x)

    def loads_elsewhere(self, r: redis.Redis, w: Workload, n: int, k: int) -> None:
        """`n` loads measured again (their lists, and the medians the scheduler plans with, change)."""
        for reps in list(self.replicas.values())[:n]:
            ready = [x for x in reps if x.state == rs.READY]
            if ready:
                x = ready[k % len(ready)]
                x.load_seconds = round((x.load_seconds or 1.0) * float(w.rng.uniform(0.9, 1.1)), 3)
                replica_ready(r, x)

    def heartbeat(self, r: redis.Redis, ttl: float) -> None:
        """Every GPU announces itself and its replicas, as each worker does every heartbeat."""
        now = time.time()
        for g in self.gpus:
            g.last_heartbeat = now
            state.write_heartbeat(r, g, self.replicas[g.id], ttl)


@dataclass
class _Loading:
    replica: state.Replica
    ready_at: float
    intent_id: str


@dataclass
class BenchWorker:
    """What the GPUs' workers do with the scheduler's tasks, at the speed of the bench's storage, so the ticks
    see a fleet that changes as a live one does: between ticks it takes every task waiting in each GPU's
    queue; an evict removes its replica at once, a preload becomes a loading replica that turns ready after
    its load time (size at LOAD_GIB_S) and is recorded as its worker records it. Each task's intent is
    released once done, as the worker releases it. A preload with no room left, or of a replica already
    there, is dropped (its intent released), as a worker fails it. Without it (`--no-worker`) nothing the
    scheduler sends is ever done: its intents stay in flight until they expire and the replicas it evicts
    stay resident, so each tick finds the fleet fuller and plans more evictions for the same loads."""

    fleet: BenchFleet
    sizes: dict[str, int]
    loading: list[_Loading] = field(default_factory=list)
    tasks: int = 0

    def step(self, r: redis.Redis, now: float) -> int:
        """Take the queued tasks and finish the loads whose time has come; returns the tasks taken."""
        pipe = r.pipeline(transaction=False)
        for g in self.fleet.gpus:
            pipe.lrange(g.queue, 0, -1)
            pipe.delete(g.queue)
        raw = pipe.execute()[::2]
        taken = 0
        for g, messages in zip(self.fleet.gpus, raw, strict=True):
            for m in reversed(messages):  # kombu LPUSHes: the oldest is last
                task, args, kwargs = _task(m)
                self._do(r, g, task, args, kwargs, now)
                taken += 1
        for x in [x for x in self.loading if x.ready_at <= now]:
            self.loading.remove(x)
            rep = x.replica
            rep.state, rep.progress, rep.bytes, rep.since = rs.READY, 1.0, rep.total_bytes, x.ready_at
            replica_ready(r, rep)
            state.release_intent(r, rep.model, rep.gpu, x.intent_id)
        self.tasks += taken
        return taken

    def _do(self, r: redis.Redis, g: state.Gpu, task: str, args: list, kwargs: dict, now: float) -> None:
        from prewarm import celery_app

        model, intent_id = str(args[0]), str(kwargs.get("intent_id", ""))
        reps = self.fleet.replicas[g.id]
        if task == celery_app.EVICT:
            for x in [x for x in reps if x.model == model]:
                reps.remove(x)
                g.used_bytes -= x.total_bytes
                g.free_bytes += x.total_bytes
            self.loading = [x for x in self.loading if not (x.replica.gpu == g.id and x.replica.model == model)]
        elif task == celery_app.PRELOAD and model in self.sizes:
            size = self.sizes[model]
            if g.free_bytes >= size and all(x.model != model for x in reps):
                load_s = size / (LOAD_GIB_S * GIB)
                rep = state.Replica(model=model, version=str(args[1]), gpu=g.id, state=rs.LOADING, bytes=0,
                                    total_bytes=size, load_seconds=round(load_s, 3), warmup_seconds=0.2, since=now,
                                    created_at=now, reason=str(kwargs.get("reason", "")), source="storage")
                reps.append(rep)
                g.used_bytes += size
                g.free_bytes -= size
                self.loading.append(_Loading(rep, now + load_s, intent_id))
                return  # its intent is released when it is ready
        state.release_intent(r, model, g.id, intent_id)


def _task(message: bytes) -> tuple[str, list, dict]:
    """(task name, args, kwargs) of a Celery message as kombu's Redis transport stores it (protocol 2)."""
    m = json.loads(message)
    body = json.loads(base64.b64decode(m["body"])) if m["properties"].get("body_encoding") == "base64" \
        else json.loads(m["body"])
    return m["headers"]["task"], body[0], body[1]
