"""Fleet state in Redis as plain dataclasses, readable without torch by web, scheduler and CLI.

The worker is the authority on what is on its device: it writes its GPUs and replicas here (heartbeat,
state transitions) with a TTL, so a dead worker's GPUs and replicas drop out by themselves. Readers get
`Fleet`/`Gpu`/`Replica`; in-flight intents (actions dispatched but not yet confirmed) are read separately.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from prewarm import keys

REPLICA_STATES = ("pending", "loading", "warming", "ready", "evicting", "failed")


def gpu_id(node: str, device: str) -> str:
    return f"{node}/{device}"


def queue_name(node: str, device: str) -> str:
    """One Celery queue per GPU: gpu.<node>.<device>."""
    return f"gpu.{node}.{device}"


def replica_field(model: str, version: str) -> str:
    return f"{model}@{version}"


@dataclass
class Replica:
    model: str
    version: str
    gpu: str
    state: str
    bytes: int = 0  # device bytes the worker measured for this replica (so far, while loading)
    total_bytes: int = 0  # bytes to load, from the weights' headers
    progress: float = 0.0  # 0..1 while loading; 1 once loaded
    load_seconds: float | None = None
    warmup_seconds: float | None = None
    error: str | None = None
    since: float = 0.0  # when it entered the current state
    created_at: float = 0.0  # when the load started
    in_flight: int = 0  # infer calls running now
    last_used: float | None = None  # last infer on this replica
    reason: str | None = None  # why it was loaded (the dispatching decision)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Replica:
        data = json.loads(raw)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Gpu:
    id: str
    node: str
    device: str
    queue: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    last_heartbeat: float
    worker: str = ""
    started_at: float = 0.0
    kind: str = "cpu"
    alive: bool = True  # False: heartbeat expired (kept for display as stale, never routed to)
    replicas: list[Replica] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d["replicas"] = [r.public() for r in self.replicas]
        return d


@dataclass
class Fleet:
    gpus: list[Gpu]

    def alive(self) -> list[Gpu]:
        return [g for g in self.gpus if g.alive]

    def replicas(self, model: str | None = None) -> list[Replica]:
        return [r for g in self.alive() for r in g.replicas if model is None or r.model == model]

    def gpu(self, gid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.id == gid), None)


_GPU_INT = ("total_bytes", "used_bytes", "free_bytes")
_GPU_FLOAT = ("last_heartbeat", "started_at")


def _decode(h: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in h.items()}


def read_fleet(r: redis.Redis, *, include_stale: bool = True) -> Fleet:
    """Every GPU ever announced; stale ones (no heartbeat within the TTL) flagged alive=False, no replicas."""
    ids = sorted(x.decode() for x in r.smembers(keys.GPUS))
    pipe = r.pipeline(transaction=False)
    for gid in ids:
        pipe.hgetall(keys.gpu(gid))
        pipe.hgetall(keys.replicas(gid))
    raw = pipe.execute()
    gpus: list[Gpu] = []
    for i, gid in enumerate(ids):
        info, reps = _decode(raw[2 * i]), raw[2 * i + 1]
        if not info:
            if include_stale:
                node, _, device = gid.partition("/")
                gpus.append(Gpu(id=gid, node=node, device=device, queue=queue_name(node, device),
                                total_bytes=0, used_bytes=0, free_bytes=0, last_heartbeat=0.0, alive=False))
            continue
        g = Gpu(id=gid, node=info.get("node", ""), device=info.get("device", ""), queue=info.get("queue", ""),
                total_bytes=int(info.get("total_bytes", 0)), used_bytes=int(info.get("used_bytes", 0)),
                free_bytes=int(info.get("free_bytes", 0)), last_heartbeat=float(info.get("last_heartbeat", 0)),
                worker=info.get("worker", ""), started_at=float(info.get("started_at", 0)),
                kind=info.get("kind", "cpu"))
        g.replicas = sorted((Replica.from_json(v) for v in reps.values()), key=lambda x: (x.model, x.version))
        gpus.append(g)
    return Fleet(gpus)


def write_heartbeat(r: redis.Redis, gpu: Gpu, replicas: list[Replica], ttl: float) -> None:
    """Announce a GPU and its full replica set atomically, so a re-announce after a Redis restart is exact."""
    ms = int(ttl * 1000)
    info = {"node": gpu.node, "device": gpu.device, "queue": gpu.queue, "total_bytes": gpu.total_bytes,
            "used_bytes": gpu.used_bytes, "free_bytes": gpu.free_bytes, "last_heartbeat": gpu.last_heartbeat,
            "worker": gpu.worker, "started_at": gpu.started_at, "kind": gpu.kind}
    pipe = r.pipeline(transaction=True)
    pipe.sadd(keys.GPUS, gpu.id)
    pipe.hset(keys.gpu(gpu.id), mapping=info)
    pipe.pexpire(keys.gpu(gpu.id), ms)
    pipe.delete(keys.replicas(gpu.id))
    if replicas:
        pipe.hset(keys.replicas(gpu.id), mapping={replica_field(x.model, x.version): x.to_json() for x in replicas})
        pipe.pexpire(keys.replicas(gpu.id), ms)
    pipe.execute()


def put_replica(r: redis.Redis, replica: Replica, ttl: float) -> None:
    k = keys.replicas(replica.gpu)
    pipe = r.pipeline(transaction=True)
    pipe.hset(k, replica_field(replica.model, replica.version), replica.to_json())
    pipe.pexpire(k, int(ttl * 1000))
    pipe.execute()


def drop_replica(r: redis.Redis, gpu: str, model: str, version: str) -> None:
    r.hdel(keys.replicas(gpu), replica_field(model, version))


def clear_gpu(r: redis.Redis, gpu: str) -> None:
    """A starting worker clears stale claims for its GPU: old replicas and in-flight intents."""
    pipe = r.pipeline(transaction=True)
    pipe.delete(keys.replicas(gpu), keys.gpu(gpu))
    for k in r.scan_iter(match=keys.INTENT_PATTERN, count=1000):
        if k.decode().endswith(":" + gpu):
            pipe.delete(k)
    pipe.execute()


# --- intents -----------------------------------------------------------------------------------------
@dataclass
class Intent:
    action: str  # "preload" | "evict"
    model: str
    version: str
    gpu: str
    actor: str
    reason: str
    created_at: float
    expires_at: float
    task_id: str = ""
    kind: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def claim_intent(r: redis.Redis, intent: Intent) -> bool:
    """Claim (model, gpu) for one in-flight action; False if another action already holds it."""
    ttl_ms = max(1, int((intent.expires_at - intent.created_at) * 1000))
    return bool(r.set(keys.intent(intent.model, intent.gpu), intent.to_json(), nx=True, px=ttl_ms))


def update_intent(r: redis.Redis, intent: Intent) -> None:
    ttl_ms = max(1, int((intent.expires_at - time.time()) * 1000))
    r.set(keys.intent(intent.model, intent.gpu), intent.to_json(), xx=True, px=ttl_ms)


def release_intent(r: redis.Redis, model: str, gpu: str) -> None:
    r.delete(keys.intent(model, gpu))


def read_intents(r: redis.Redis) -> list[Intent]:
    found = list(r.scan_iter(match=keys.INTENT_PATTERN, count=1000))
    if not found:
        return []
    out = []
    for raw in r.mget(found):
        if raw:
            d = json.loads(raw)
            out.append(Intent(**{k: v for k, v in d.items() if k in Intent.__dataclass_fields__}))
    return out
