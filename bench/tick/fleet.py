"""What `prewarm bench tick` writes before it ticks: catalog, GPUs with replicas, load times, traffic."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis

from prewarm import state, traffic
from prewarm.store.ready import replica_ready

GIB = 1024**3
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
                    model=w.ids[m], version="v1", gpu=g.id, state="ready", bytes=size, total_bytes=size,
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
            if reps:
                x = reps[k % len(reps)]
                x.load_seconds = round((x.load_seconds or 1.0) * float(w.rng.uniform(0.9, 1.1)), 3)
                replica_ready(r, x)

    def heartbeat(self, r: redis.Redis, ttl: float) -> None:
        """Every GPU announces itself and its replicas, as each worker does every heartbeat."""
        now = time.time()
        for g in self.gpus:
            g.last_heartbeat = now
            state.write_heartbeat(r, g, self.replicas[g.id], ttl)
