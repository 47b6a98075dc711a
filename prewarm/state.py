"""Fleet state in Redis as plain dataclasses, readable without torch by web, scheduler and CLI.

The worker is the authority on what is on its device: it writes its GPUs and replicas here (heartbeat,
state transitions) with a TTL, so a dead worker's GPUs and replicas drop out by themselves. Readers get
`Fleet`/`Gpu`/`Replica`; in-flight intents (actions dispatched but not yet confirmed) are read separately.

Each node's worker also keeps a host-memory cache of staged models (the staging tier, issue 4): a `Node`
(its host cache budget/used/free) with its `Staged` models. Staged models are node-level entries, not GPU
replicas: they hold host memory, not device memory, so GPU accounting is unchanged by them.

A GPU takes new loads only while its heartbeat is fresh (`Gpu.fresh`, `Fleet.placeable`): the record lives a
TTL of several beats, and a worker that stopped (SIGSTOP, swap, a partition) keeps its GPUs alive that long,
so a load sent there would run only once it resumes, long after the scheduler placed the model elsewhere.
Nor does a GPU of a draining node (`Gpu.draining`, prewarm.store.drains): its replicas are being moved off.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from prewarm import keys
from prewarm.domain import states as rs
from prewarm.store import drains

# The state names are spelled in prewarm.domain.states; these are the fleet records' names for them.
REPLICA_STATES = rs.REPLICA_STATES
STAGED_STATES = rs.STAGED_STATES
# A GPU whose last heartbeat is older than this many of its worker's beats is late: its worker missed two
# beats in a row (a beat's own work stretches one a little, never by a whole period), so it gets no new loads.
FRESH_BEATS = 3.0
# ...and never sooner than this: on a loaded machine one beat can come a second or two late (tests beat every
# 0.5 s), and a late GPU leaves the scheduler's snapshot, replicas and all.
FRESH_MIN_S = 3.0


def gpu_id(node: str, device: str) -> str:
    return f"{node}/{device}"


def queue_name(node: str, device: str) -> str:
    """One Celery queue per GPU: gpu.<node>.<device>."""
    return f"gpu.{node}.{device}"


def replica_field(model: str, version: str) -> str:
    return f"{model}@{version}"


def host_id(node: str) -> str:
    """The target id of a node's host cache in intents and events (`node-a/host`); no GPU has this id."""
    return f"{node}/host"


def host_node(target: str) -> str | None:
    """host_id's inverse: the node whose host cache `target` (an intent's gpu) is, or None for a GPU id."""
    node = target.removesuffix("/host")
    return node if node != target else None


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
    ready_at: float | None = None  # when it became ready: its age (catalog max_replica_age) counts from here
    priority: str | None = None  # the load's priority (prewarm.priority) when not normal: a pending one's queue order
    in_flight: int = 0  # infer calls running now
    last_used: float | None = None  # last infer on this replica
    reason: str | None = None  # why it was loaded (the dispatching decision)
    source: str | None = None  # where the bytes came from: "host" (promoted from the host cache) | "storage"
    endpoint: str | None = None  # a replica served over HTTP (vllm): its OpenAI base URL, for routers
    host: str | None = None  # a LoRA adapter's replica: the "model@version" of the base replica on this GPU holding it

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Replica:
        data = json.loads(raw)
        known = cls.__dataclass_fields__
        # another writer's JSON may spell a count 8388608.0: the record's int fields hold ints (the policy's
        # natively built records check their field types)
        return cls(**{k: int(v) if isinstance(v, float) and known[k].type == "int" else v
                      for k, v in data.items() if k in known})

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
    heartbeat_seconds: float = 0.0  # its worker's beat period, from the record (0: not given, freshness unjudged)
    fresh: bool = True  # alive and its heartbeat younger than FRESH_BEATS beats (heartbeat_fresh): takes loads
    draining: bool = False  # its node is draining or drained (prewarm.store.drains): takes no new loads
    replicas: list[Replica] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d["replicas"] = [r.public() for r in self.replicas]
        return d


@dataclass
class Staged:
    """One model's bytes in a node's host cache (state "staging" while being read, then "staged")."""

    model: str
    version: str
    node: str
    state: str
    bytes: int = 0  # host bytes the cache holds for it (what its budget counts; so far, while staging)
    total_bytes: int = 0  # bytes to stage
    progress: float = 0.0
    value: float = 0.0  # the keep-value given when staged: eviction compares value per byte
    staged_at: float = 0.0
    stage_seconds: float | None = None
    pinned: bool = False  # page-locked host memory (where CUDA exists): faster promotion
    promotions: int = 0  # preloads served from this copy
    last_promoted_at: float | None = None
    reason: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Staged:
        data = json.loads(raw)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Node:
    """A node's host cache inventory and what is staged in it."""

    node: str
    budget_bytes: int
    used_bytes: int  # staged bytes plus what stages in progress have reserved
    free_bytes: int
    last_heartbeat: float = 0.0
    worker: str = ""
    pinned: bool = False
    staged: list[Staged] = field(default_factory=list)
    # Catalog entries this node's worker refused (entry name -> problem), published with every heartbeat:
    # the worker serves the rest, and web shows these in /api/models `catalog_problems`.
    catalog_problems: dict[str, str] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {"node": self.node,
                "host_cache": {"budget_bytes": self.budget_bytes, "used_bytes": self.used_bytes,
                               "free_bytes": self.free_bytes, "pinned": self.pinned},
                "staged": [x.public() for x in self.staged],
                "worker": self.worker, "last_heartbeat": self.last_heartbeat,
                "catalog_problems": dict(self.catalog_problems)}

    def get(self, model: str, version: str | None = None) -> Staged | None:
        return next((x for x in self.staged if x.model == model and version in (None, x.version)), None)


@dataclass
class Fleet:
    gpus: list[Gpu]
    nodes: list[Node] = field(default_factory=list)  # live nodes' host caches (nodes whose worker is alive)
    drain_records: dict[str, drains.Drain] = field(default_factory=dict)  # node -> its drain (draining/drained)

    def alive(self) -> list[Gpu]:
        return [g for g in self.gpus if g.alive]

    def placeable(self) -> list[Gpu]:
        """The GPUs a new load may go to: alive with a fresh heartbeat, on a node that is not draining (module
        docstring). Every placement (the route hook, the operator's preload, the scheduler's snapshot and the
        drain's replacements) chooses among these."""
        return [g for g in self.gpus if g.alive and g.fresh and not g.draining]

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.node == name), None)

    def staged(self, model: str | None = None, *, ready_only: bool = True) -> list[Staged]:
        """Staged models across live nodes (`ready_only`: state "staged", not those still staging)."""
        return [x for n in self.nodes for x in n.staged
                if (model is None or x.model == model) and (not ready_only or x.state == rs.STAGED)]

    def replicas(self, model: str | None = None) -> list[Replica]:
        return [r for g in self.alive() for r in g.replicas if model is None or r.model == model]

    def gpu(self, gid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.id == gid), None)


def node_carrier(gpus: Iterable[Gpu], node: str) -> Gpu | None:
    """The GPU whose queue carries node-level tasks (stage/unstage of the node's host cache) to `node`'s
    worker: its first live GPU by id; None when the node has none."""
    return min((g for g in gpus if g.node == node and g.alive), key=lambda g: g.id, default=None)


def heartbeat_fresh(last_heartbeat: float, heartbeat_seconds: float, now: float) -> bool:
    """Whether a heartbeat written at `last_heartbeat` (the worker's clock: clocks are assumed in step, as
    intents' deadlines assume) by a worker beating every `heartbeat_seconds` is fresh at `now`. A record
    that gives no period (0) is judged by its TTL alone."""
    return heartbeat_seconds <= 0 or now - last_heartbeat <= max(FRESH_BEATS * heartbeat_seconds, FRESH_MIN_S)


def late_reason(gpu: Gpu, now: float) -> str:
    """How late a GPU's heartbeat is, in words, for the messages of placements that pass it over."""
    return f"{gpu.id} last beat {now - gpu.last_heartbeat:.1f} s ago, its worker beats every {gpu.heartbeat_seconds:g} s"


class Departure:
    """Whether a GPU that someone waits on (an operator's `--wait`) has left the fleet: once its record has
    been missing or stale for `grace_s` on end. One read without it is not enough: a heartbeat can lapse
    for a moment and come back with the same worker and its task still running (a worker starved of CPU for
    a TTL on a busy node, a Sentinel failover that lost the last beat), and a wait that gave up then would
    report a failure that did not happen. `clock`: monotonic seconds (a parameter for the unit test)."""

    def __init__(self, gpu: str, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.gpu = gpu
        self.grace_s = max(0.0, grace_s)
        self.clock = clock
        self.missing_since: float | None = None

    def left(self, g: Gpu | None) -> str | None:
        """None while the GPU is in the fleet or missing for less than the grace; else why the wait ends."""
        if g is not None and g.alive:
            self.missing_since = None
            return None
        now = self.clock()
        if self.missing_since is None:
            self.missing_since = now
        if now - self.missing_since < self.grace_s:
            return None
        return f"GPU {self.gpu} left the fleet while waiting (no heartbeat for {now - self.missing_since:.0f} s)"


_GPU_INT = ("total_bytes", "used_bytes", "free_bytes")
_GPU_FLOAT = ("last_heartbeat", "started_at")


def _decode(h: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in h.items()}


def read_fleet(r: redis.Redis, *, include_stale: bool = True, parsed: dict[bytes, Replica] | None = None,
               now: float | None = None) -> Fleet:
    """Every GPU ever announced; stale ones (no heartbeat within the TTL) flagged alive=False, no replicas;
    live ones whose heartbeat is late at `now` (default: the clock) flagged fresh=False (heartbeat_fresh).
    `nodes`: every live node's host cache and staged models (read in the same round trips).

    `parsed`: a reader's cache from a replica record to the Replica parsed from it, kept between reads (the
    scheduler's every tick): a record unchanged since the last read is not parsed again, and the Replica is
    the same object, so such a reader must not change them. Left holding this read's records only."""
    pipe = r.pipeline(transaction=False)
    pipe.smembers(keys.GPUS)
    pipe.smembers(keys.NODES)
    pipe.hgetall(keys.DRAINING)
    gpu_ids, node_names, drain_records = pipe.execute()
    drained = drains.parse_all(drain_records)
    ids = sorted(x.decode() for x in gpu_ids)
    names = sorted(x.decode() for x in node_names)
    pipe = r.pipeline(transaction=False)
    for gid in ids:
        pipe.hgetall(keys.gpu(gid))
        pipe.hgetall(keys.replicas(gid))
    for name in names:
        pipe.hgetall(keys.host_cache(name))
        pipe.hgetall(keys.staged(name))
    raw = pipe.execute()
    now = time.time() if now is None else now
    nodes = _nodes(names, raw[2 * len(ids):])
    raw = raw[:2 * len(ids)]
    gpus: list[Gpu] = []
    seen: dict[bytes, Replica] = {}  # this read's records (with `parsed`)
    for i, gid in enumerate(ids):
        info, reps = _decode(raw[2 * i]), raw[2 * i + 1]
        if not info:
            if include_stale:
                node, _, device = gid.partition("/")
                gpus.append(Gpu(id=gid, node=node, device=device, queue=queue_name(node, device),
                                total_bytes=0, used_bytes=0, free_bytes=0, last_heartbeat=0.0, alive=False,
                                fresh=False))
            continue
        beat, period = float(info.get("last_heartbeat", 0)), float(info.get("heartbeat_seconds", 0))
        g = Gpu(id=gid, node=info.get("node", ""), device=info.get("device", ""), queue=info.get("queue", ""),
                total_bytes=int(info.get("total_bytes", 0)), used_bytes=int(info.get("used_bytes", 0)),
                free_bytes=int(info.get("free_bytes", 0)), last_heartbeat=beat,
                worker=info.get("worker", ""), started_at=float(info.get("started_at", 0)),
                kind=info.get("kind", "cpu"), heartbeat_seconds=period,
                fresh=heartbeat_fresh(beat, period, now), draining=info.get("node", "") in drained)
        if parsed is None:
            g.replicas = sorted((Replica.from_json(v) for v in reps.values()), key=_replica_order)
        else:
            for v in reps.values():
                seen[v] = parsed.get(v) or Replica.from_json(v)
            g.replicas = sorted((seen[v] for v in reps.values()), key=_replica_order)
        gpus.append(g)
    if parsed is not None:
        parsed.clear()
        parsed.update(seen)
    return Fleet(gpus, nodes, drained)


def _replica_order(x: Replica) -> tuple[str, str]:
    return (x.model, x.version)


def _nodes(names: list[str], raw: list[dict[bytes, bytes]]) -> list[Node]:
    out = []
    for i, name in enumerate(names):
        info, staged = _decode(raw[2 * i]), raw[2 * i + 1]
        if not info:
            continue  # its worker stopped heartbeating: nothing staged there can be promoted
        n = Node(node=name, budget_bytes=int(info.get("budget_bytes", 0)), used_bytes=int(info.get("used_bytes", 0)),
                 free_bytes=int(info.get("free_bytes", 0)), last_heartbeat=float(info.get("last_heartbeat", 0)),
                 worker=info.get("worker", ""), pinned=info.get("pinned") == "1",
                 catalog_problems=_problems(info.get("catalog_problems")))
        n.staged = sorted((Staged.from_json(v) for v in staged.values()), key=lambda x: (x.model, x.version))
        out.append(n)
    return out


def _problems(raw: str | None) -> dict[str, str]:
    """The node record's catalog_problems field (JSON object of strings); anything else reads as none."""
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def read_nodes(r: redis.Redis) -> list[Node]:
    """Every live node's host cache with its staged models."""
    names = sorted(x.decode() for x in r.smembers(keys.NODES))
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.host_cache(name))
        pipe.hgetall(keys.staged(name))
    return _nodes(names, pipe.execute())


def read_staged(r: redis.Redis) -> dict[str, list[Staged]]:
    """node -> its staged models (states "staging" and "staged"), for every live node."""
    return {n.node: n.staged for n in read_nodes(r)}


def _announce(r: redis.Redis, registry: str, member: str, info_key: str, info: dict[str, Any],
              items_key: str, items: dict[str, str], ttl: float) -> None:
    """One atomic announcement: the member in its registry set, its info hash and its full item hash
    (replicas of a GPU, staged models of a node), both expiring with the heartbeat's TTL."""
    ms = int(ttl * 1000)
    pipe = r.pipeline(transaction=True)
    pipe.sadd(registry, member)
    pipe.hset(info_key, mapping=info)
    pipe.pexpire(info_key, ms)
    pipe.delete(items_key)
    if items:
        pipe.hset(items_key, mapping=items)
        pipe.pexpire(items_key, ms)
    pipe.execute()


def _clear(r: redis.Redis, target: str, *record_keys: str) -> None:
    """Delete a target's records and every in-flight intent on it (intent keys end in ':<target>')."""
    pipe = r.pipeline(transaction=True)
    pipe.delete(*record_keys)
    for k in r.scan_iter(match=keys.INTENT_PATTERN, count=1000):
        if k.decode().endswith(":" + target):
            pipe.delete(k)
    pipe.execute()


def write_node(r: redis.Redis, node: Node, staged: list[Staged], ttl: float) -> None:
    """Announce a node's host cache and its full staged set atomically (like write_heartbeat for a GPU)."""
    info = {"budget_bytes": node.budget_bytes, "used_bytes": node.used_bytes, "free_bytes": node.free_bytes,
            "last_heartbeat": node.last_heartbeat, "worker": node.worker, "pinned": int(node.pinned),
            "catalog_problems": json.dumps(node.catalog_problems, sort_keys=True)}
    _announce(r, keys.NODES, node.node, keys.host_cache(node.node), info, keys.staged(node.node),
              {replica_field(x.model, x.version): x.to_json() for x in staged}, ttl)


def clear_node(r: redis.Redis, node: str) -> None:
    """A starting worker clears its node's stale host cache records and host-cache intents."""
    _clear(r, host_id(node), keys.host_cache(node), keys.staged(node))


def gpu_info(gpu: Gpu) -> dict[str, Any]:
    """A GPU's inventory hash as its worker writes it (the heartbeat, and each publish between beats)."""
    return {"node": gpu.node, "device": gpu.device, "queue": gpu.queue, "total_bytes": gpu.total_bytes,
            "used_bytes": gpu.used_bytes, "free_bytes": gpu.free_bytes, "last_heartbeat": gpu.last_heartbeat,
            "heartbeat_seconds": gpu.heartbeat_seconds, "worker": gpu.worker, "started_at": gpu.started_at,
            "kind": gpu.kind}


def write_heartbeat(r: redis.Redis, gpu: Gpu, replicas: list[Replica], ttl: float) -> None:
    """Announce a GPU and its full replica set atomically, so a re-announce after a Redis restart is exact."""
    _announce(r, keys.GPUS, gpu.id, keys.gpu(gpu.id), gpu_info(gpu), keys.replicas(gpu.id),
              {replica_field(x.model, x.version): x.to_json() for x in replicas}, ttl)


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
    _clear(r, gpu, keys.replicas(gpu), keys.gpu(gpu))


# --- intents -----------------------------------------------------------------------------------------
@dataclass
class Intent:
    action: str  # "preload" | "evict" | "stage" | "unstage" (these two: gpu is host_id(node))
    model: str
    version: str
    gpu: str
    actor: str
    reason: str
    created_at: float
    expires_at: float
    task_id: str = ""
    kind: str = ""
    # Which dispatch this is: the task carries it (task_kwargs), so a worker can tell its own intent from
    # a later one for the same (model, gpu). "": claimed without one (by hand, or before ids existed).
    id: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    def task_kwargs(self) -> dict[str, Any]:
        """What every dispatched task carries of its intent: the worker drops a task delivered after its
        intent expired or was superseded (a redelivery long after a worker died) as stale."""
        return {"intent_id": self.id, "deadline": self.expires_at}


def claim_intent(r: redis.Redis, intent: Intent) -> bool:
    """Claim (model, gpu) for one in-flight action; False if another action already holds it."""
    ttl_ms = max(1, int((intent.expires_at - intent.created_at) * 1000))
    return bool(r.set(keys.intent(intent.model, intent.gpu), intent.to_json(), nx=True, px=ttl_ms))


# The compare-and-set steps run as Lua so each is atomic: the held record is read and changed in one step.
_CLAIM_OVER = """
local held = redis.call('GET', KEYS[1])
if held then
  local ok, h = pcall(cjson.decode, held)
  if not (ok and type(h) == 'table' and h['version'] == ARGV[3]
          and string.find(ARGV[4], ',' .. tostring(h['action']) .. ',', 1, true)) then
    return {0, held}
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, held or ''}
"""
_RELEASE_MINE = """
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
local ok, h = pcall(cjson.decode, held)
if ok and type(h) == 'table' and (type(h['id']) == 'string' and h['id'] or '') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_EXTEND_MINE = """
local held = redis.call('GET', KEYS[1])
if not held then return false end
local ok, h = pcall(cjson.decode, held)
if not (ok and type(h) == 'table' and (type(h['id']) == 'string' and h['id'] or '') == ARGV[1]) then
  return false
end
local span = tonumber(h['expires_at']) - tonumber(h['created_at'])
h['expires_at'] = tonumber(ARGV[2]) + span
redis.call('SET', KEYS[1], cjson.encode(h), 'PX', math.max(1, math.floor(span * 1000)))
return tostring(h['expires_at'])
"""


def claim_intent_over(r: redis.Redis, intent: Intent, supersedes: Iterable[str]) -> tuple[bool, Intent | None]:
    """claim_intent, except that an intent already held for the same version whose action is one of
    `supersedes` is replaced (an evict takes over the preload in flight: the worker then cancels that load,
    and drops its task as stale if it has not started). Returns (claimed, the intent held before: the one
    replaced, or the one that refused this claim; None when there was none or it cannot be read)."""
    ttl_ms = max(1, int((intent.expires_at - intent.created_at) * 1000))
    claimed, held = r.eval(_CLAIM_OVER, 1, keys.intent(intent.model, intent.gpu), intent.to_json(), ttl_ms,
                           intent.version, "," + ",".join(supersedes) + ",")
    return bool(claimed), _parse_intent(held) if held else None


def claim_intents(r: redis.Redis, claims: Sequence[tuple[Intent, Collection[str]]]) -> list[tuple[bool, Intent | None]]:
    """claim_intent_over for many intents in one pipelined round trip, in order (a later claim on the same
    (model, gpu) sees an earlier one). An empty `supersedes` is a plain claim (claim_intent) that also says
    which intent refused it. One answer per claim, as claim_intent_over gives."""
    if not claims:
        return []
    pipe = r.pipeline(transaction=False)
    for intent, supersedes in claims:
        ttl_ms = max(1, int((intent.expires_at - intent.created_at) * 1000))
        pipe.eval(_CLAIM_OVER, 1, keys.intent(intent.model, intent.gpu), intent.to_json(), ttl_ms, intent.version,
                  "," + ",".join(supersedes) + ",")
    return [(bool(claimed), _parse_intent(held) if held else None) for claimed, held in pipe.execute()]


def queue_release_intent(pipe: redis.client.Pipeline, model: str, gpu: str, intent_id: str) -> None:
    """release_intent queued on a pipeline (the dispatcher's records of a batch go in one round trip)."""
    pipe.eval(_RELEASE_MINE, 1, keys.intent(model, gpu), intent_id)


def release_intent(r: redis.Redis, model: str, gpu: str, intent_id: str) -> bool:
    """Release (model, gpu)'s intent if it is the one with `intent_id` ("": one claimed without an id);
    an intent that has since replaced it (an evict taking over a preload) is left alone."""
    return bool(r.eval(_RELEASE_MINE, 1, keys.intent(model, gpu), intent_id))


def extend_intent(r: redis.Redis, model: str, gpu: str, intent_id: str, now: float | None = None) -> float | None:
    """Push the deadline of (model, gpu)'s intent `intent_id` out by its original span (a worker keeps a
    preload it holds queued alive this way); its new deadline, or None when that intent is no longer held."""
    out = r.eval(_EXTEND_MINE, 1, keys.intent(model, gpu), intent_id, repr(time.time() if now is None else now))
    return float(out) if out else None


def held_intent(r: redis.Redis, model: str, gpu: str) -> Intent | None:
    """The intent held for (model, gpu), or None (none, or an unreadable record)."""
    raw = r.get(keys.intent(model, gpu))
    return _parse_intent(raw) if raw else None


def _parse_intent(raw: str | bytes) -> Intent | None:
    try:
        return _intent(json.loads(raw))
    except (ValueError, TypeError, AttributeError):
        return None


def _intent(d: dict[str, Any]) -> Intent:
    return Intent(**{k: v for k, v in d.items() if k in Intent.__dataclass_fields__})


def read_intents(r: redis.Redis) -> list[Intent]:
    found = list(r.scan_iter(match=keys.INTENT_PATTERN, count=1000))
    if not found:
        return []
    out = []
    for raw in r.mget(found):
        if raw:
            out.append(_intent(json.loads(raw)))
    return out


def held_intents(r: redis.Redis, targets: Iterable[tuple[str, str]]) -> list[Intent]:
    """The intents held for these (model, gpu) pairs, in one round trip; a pair with none, or with an
    unreadable record, is left out."""
    targets = list(targets)
    if not targets:
        return []
    out = []
    for raw in r.mget([keys.intent(m, g) for m, g in targets]):
        if raw:
            try:
                out.append(_intent(json.loads(raw)))
            except (ValueError, TypeError, AttributeError):
                continue
    return out
