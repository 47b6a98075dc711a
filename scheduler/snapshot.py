"""Reading what the scheduler knows into a policy `Snapshot` (the I/O side of the tick).

Catalog, measured load and promotion times, operator pins and rollouts, the fleet and its replicas, each
live node's host cache and what is staged in it (the staging tier), in-flight intents, and the traffic: per-second request counts read from Redis since the last tick and fed into one
`TrafficHistory` that lives as long as the process (warmed from per-minute buckets at start, so a new
leader knows the last hours' patterns too).

Model keys: the policy sees one `ModelSpec` per model id at its current catalog version; a version under
rollout, or an old version still resident, appears as `"<id>@<version>"`. During a rollout the requests
reported for the model are split between the versions by the rollout's traffic fraction, and the new
version's `min_replicas` covers that fraction of the current replicas, so the policy warms the new version
before the router shifts traffic and releases the old one as its share falls, with no special case in
`plan`.

Staging tier: `Snapshot.nodes` has one `NodeState` per live node's host cache, `Snapshot.staged` one
`StagedState` per staged or staging model there (keyed like replicas, so an old version staged shows as
`"<id>@<version>"`). Stage/unstage intents are claimed on `state.host_id(node)`; the policy sees them as
`Intent(kind="stage"|"unstage", gpu=<node>)`. The fleet read brings the host caches in the same round trips
as the GPUs, and promotion times come in the load times' pipeline, so the staging tier adds no round trip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from prewarm import events, keys, state, traffic
from prewarm import priority as priorities
from prewarm.catalog_entries import Catalog, ModelEntry
from prewarm.domain import states as rs
from prewarm.domain.policy import (
    GpuState,
    Intent,
    ModelSpec,
    NodeState,
    PolicyConfig,
    ReplicaState,
    Snapshot,
    StagedState,
    TrafficHistory,
    traffic_keys,
)
from prewarm.store import cold_starts, load_times, overlays

HISTORY_WARMUP_S = 4 * 3600  # how far back a starting scheduler reads per-minute traffic
WAITING_MAX_AGE_S = 600  # an open cold start older than this was abandoned (e.g. its loads kept failing)
LATE_EVENT_LAG_S = 2  # per-second buckets this recent may still receive batched events: read them later


@dataclass(frozen=True)
class ModelRef:
    id: str
    version: str


def model_key(catalog: Catalog, model_id: str, version: str) -> str:
    current = catalog.get(model_id).version if model_id in catalog else None
    return model_id if version == current else f"{model_id}@{version}"


def medians(measured: dict[str, load_times.Measured]) -> tuple[dict[str, float], dict[str, float]]:
    """Median load and promote seconds per model (prewarm.store.load_times.median_seconds: the route hook's
    ETA uses the same)."""
    return load_times.median_seconds(measured)


def measured_seconds(r: redis.Redis, model_ids: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """`medians` of every model's measurements read in full, in one pipelined round trip."""
    return medians(load_times.recent(r, model_ids))


# key -> (catalog entry, (load s, pinned, min replicas, promote s), its ModelSpec, its ModelRef): SnapshotReader._spec
_SpecMemo = dict[str, tuple[ModelEntry, tuple[float | None, bool, int, float | None, int], ModelSpec, ModelRef]]


def _sparse_window(r: redis.Redis, resolution_s: int, start: float, end: float) -> dict[str, list[tuple[int, int]]]:
    """The buckets of traffic.read_window(r, resolution_s, start, end) as model -> [(bucket start, count)] of
    its non-zero buckets, oldest first, models in the order read_window gives them (so the history is fed in
    the same order). Sparse: four hours of minutes at 10,000 models are ~200 k counts, not 2.4 M zeros."""
    if resolution_s not in traffic.RETENTION_S:
        raise ValueError(f"resolution_s must be one of {sorted(traffic.RETENTION_S)}")
    first = traffic.bucket_start(start, resolution_s)
    n = max(0, (traffic.bucket_start(end, resolution_s) - first) // resolution_s)
    if n > traffic.MAX_BUCKETS:
        raise ValueError(f"window of {n} buckets is too long (at most {traffic.MAX_BUCKETS})")
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.hgetall(keys.traffic_bucket(resolution_s, first + i * resolution_s))
    out: dict[str, list[tuple[int, int]]] = {}
    for i, h in enumerate(pipe.execute() if n else []):
        t = first + i * resolution_s
        for raw_model, raw_count in h.items():
            c = int(raw_count)
            series = out.get(model := raw_model.decode())
            if series is None:
                series = out[model] = []
            if c:
                series.append((t, c))
    return out


class SnapshotReader:
    def __init__(self, r: redis.Redis, config: PolicyConfig) -> None:
        self.r = r
        self.config = config
        self.history = TrafficHistory.for_config(config)
        self.fed_until: int | None = None  # traffic seconds before this are in the history
        self.recent_evictions: dict[str, float] = {}
        self.refs: dict[str, ModelRef] = {}
        self._carry: dict[str, float] = {}
        self.measured = load_times.Recent()  # every model's load times, re-read only when written
        self._replicas: dict[bytes, state.Replica] = {}  # replica records parsed last tick (read_fleet)
        # id(the parsed Replica) -> (it, the GPU, the policy's key, host, the ReplicaState made of them): a record
        # unchanged since the last read is the same Replica object (read_fleet's `parsed`), so its state is too;
        # kept for the last read's replicas only (the Replica held, so its id is not reused while it is here).
        # Rebuilding ~3,800 of them was ~7 % of each read at 10,000 models and 256 GPUs (prewarm bench tick)
        self._states: dict[int, tuple[state.Replica, str, str, str | None, ReplicaState]] = {}
        # the last read's current-version specs, what they were made from (the catalog's ids list, the pinned set)
        # and what they made (models, refs, spec memo): a read with the same ids and pins takes copies and makes
        # again only the specs of models whose load times were read anew (`measured.fresh`), instead of 10,000
        # (~10 % of a read at 10,000 models)
        self._current: tuple[list[str], set[str], dict[str, ModelSpec], dict[str, ModelRef], _SpecMemo] | None = None
        # key -> (catalog entry, (load s, pinned, min replicas, promote s), its ModelSpec, its ModelRef): the
        # specs of the last read (_specs) and of this one (_specs_now), and the last read's models dict
        self._specs: _SpecMemo = {}
        self._specs_now: _SpecMemo = {}
        self._models: dict[str, ModelSpec] | None = None
        # (model key, second, count) fed by the last feed_traffic: a baseline's per-request events
        self.arrivals: list[tuple[str, float, int]] = []
        self.bases: dict[str, str] = {}  # LoRA adapter id -> its base's (issue 29): the base's traffic counts it
        # the catalog the last read derived its ids, bases and slots from, and them: a catalog is never changed in
        # place (a reload makes a new one), and walking 10,000 entries for them was ~3 % of each read
        self._catalog: tuple[Catalog, list[str], dict[str, str], dict[str, int]] | None = None

    # --- traffic -----------------------------------------------------------------------------
    def _warm_history(self, now: float) -> None:
        minute_edge = int(now // 60 * 60) - 60
        for model, series in self._with_bases(_sparse_window(self.r, traffic.MINUTE, minute_edge - HISTORY_WARMUP_S,
                                                             minute_edge)).items():
            # each minute's count at its middle; not judged as silences (TrafficHistory.add_series)
            self.history.add_series(model, series, 30, judge=False)
        for ev in events.read(self.r, limit=500, kind="evict"):
            self.recent_evictions.setdefault(ev.model, ev.ts)
        self.fed_until = minute_edge

    def _split(self, model: str, count: int, rollouts: dict[str, tuple[str, float]]) -> list[tuple[str, int]]:
        """A model under rollout: the router sends `traffic_fraction` of its requests to the new version,
        so that share counts as the new version's demand (whole requests, the remainder carried)."""
        ro = rollouts.get(model)
        if ro is None:
            return [(model, count)]
        key, fraction = ro
        share = count * fraction + self._carry.get(key, 0.0)
        moved = int(share)
        self._carry[key] = share - moved
        return [(model, count - moved), (key, moved)]

    def feed_traffic(self, now: float, rollouts: dict[str, tuple[str, float]] | None = None) -> int:
        """Feed per-second counts since the last call; returns the requests fed. `rollouts` maps a model
        to (its new version's key, traffic fraction)."""
        self.arrivals = []
        if self.fed_until is None:
            self._warm_history(now)
        assert self.fed_until is not None
        end = int(now) - LATE_EVENT_LAG_S
        # Never ask for more than the per-second buckets keep (a long pause, e.g. after losing leadership).
        start = max(self.fed_until, end - traffic.SECOND_TTL_S + 60)
        if end <= start:
            return 0
        window = _sparse_window(self.r, traffic.SECOND, start, end)
        fed = sum(c for series in window.values() for _t, c in series)  # the requests, each once
        for model, series in self._with_bases(window).items():
            for t, c in series:
                for key, part in self._split(model, c, rollouts or {}):
                    if part:
                        self.history.add_bucket(key, t, part)
                        self.arrivals.append((key, t, part))
        self.fed_until = end
        return fed

    def _with_bases(self, window: dict[str, list[tuple[int, int]]]) -> dict[str, list[tuple[int, int]]]:
        """The window with each LoRA adapter's requests counted for its base too (traffic_keys, issue 29), the
        base's series merged in time order (the history takes a model's buckets oldest first)."""
        extra: dict[str, dict[int, int]] = {}
        for model, series in window.items():
            for key in traffic_keys(model, self.bases.get(model))[1:]:
                counts = extra.setdefault(key, {})
                for t, c in series:
                    counts[t] = counts.get(t, 0) + c
        if not extra:
            return window
        out = dict(window)
        for key, counts in extra.items():
            for t, c in out.get(key, ()):
                counts[t] = counts.get(t, 0) + c
            out[key] = sorted(counts.items())
        return out

    def note_eviction(self, model_key_: str, at: float) -> None:
        self.recent_evictions[model_key_] = at

    # --- everything else ---------------------------------------------------------------------
    def _spec(self, key: str, entry: ModelEntry, load_s: dict[str, float], pinned: set[str],
              min_replicas: int | None = None, promote_s: dict[str, float] | None = None, slots: int = 0) -> ModelSpec:
        """`slots`: a base's LoRA slots per replica when the catalog has adapters for it (issue 29; else 0)."""
        ld, pr = load_s.get(entry.id), (promote_s or {}).get(entry.id)
        pin = entry.pinned or entry.id in pinned
        floor = entry.min_replicas if min_replicas is None else min_replicas
        hit = self._specs.get(key)
        # The same spec object as last tick when nothing of it changed (specs are frozen): see read().
        if hit is not None and hit[0] is entry and hit[1] == (ld, pin, floor, pr, slots):
            spec, ref = hit[2], hit[3]
        else:
            ref = ModelRef(entry.id, entry.version)
            spec = ModelSpec(id=key, size_bytes=entry.size_bytes, version=entry.version, load_seconds=ld,
                             pinned=pin, min_replicas=floor, max_rate_per_replica=entry.max_rate_per_replica,
                             promote_seconds=pr, priority=priorities.rank(entry.priority),
                             max_replica_age_s=entry.max_replica_age_s,
                             base=entry.base if entry.is_adapter else None, max_adapters=slots)
        self._specs_now[key] = (entry, (ld, pin, floor, pr, slots), spec, ref)
        self.refs[key] = ref
        return spec

    def _old_version(self, models: dict[str, ModelSpec], catalog: Catalog, model: str, version: str,
                     load_s: dict[str, float], pinned: set[str], promote_s: dict[str, float]) -> str | None:
        """The policy's key of (model, version) found resident or staged; an old version gets a spec with no
        traffic of its own (so it goes). None: not in the catalog (any more)."""
        if model not in catalog:
            return None
        key = model_key(catalog, model, version)
        if key not in models:
            try:
                models[key] = self._spec(key, catalog.get(model, version), load_s, pinned, 0, promote_s)
            except KeyError:
                return None
        return key

    def _waiting(self, catalog: Catalog, fleet: state.Fleet, now: float) -> dict[str, float]:
        """Models a router is waiting on: the route hook answered "cold" (an open cold start) and no
        replica of that version is ready yet; each with when its first cold lookup came."""
        out: dict[str, float] = {}
        for model, c in cold_starts.read_open(self.r, now).items():
            if model not in catalog or now - c.seen_at > WAITING_MAX_AGE_S:
                continue
            if any(x.state == rs.READY and x.version == c.version for x in fleet.replicas(model)):
                continue
            out[model_key(catalog, model, c.version)] = c.seen_at
        return out

    def _catalog_view(self, catalog: Catalog) -> tuple[list[str], dict[str, str], dict[str, int]]:
        """The catalog's model ids, each adapter's base and each base's LoRA slots per replica (issue 29)."""
        c = self._catalog
        if c is None or c[0] is not catalog:
            ids = catalog.ids()
            bases = {m: catalog.get(m).base or "" for m in ids if catalog.get(m).is_adapter}
            slots = {b: catalog.get(b).max_adapters for b in set(bases.values()) if b in catalog}
            c = self._catalog = (catalog, ids, bases, slots)
        return c[1], c[2], c[3]

    def read(self, catalog: Catalog, now: float, *, full: bool = False) -> tuple[Snapshot, state.Fleet]:
        """The snapshot at `now`, and the fleet it was made from. Load times come from `self.measured`
        (only the models measured since the last read are read again); `full`: every model's are read,
        as a new reader would (the same snapshot: tests compare the two)."""
        rollouts = overlays.rollouts(self.r)
        active = {}
        for mid, ro in rollouts.items():
            if mid in catalog and ro.version != catalog.get(mid).version:
                active[mid] = (f"{mid}@{ro.version}", ro.traffic_fraction)
        # LoRA adapters (issue 29) are models with a host: the policy plans them into their bases' slots
        # (prewarm.domain.policy.adapters; a baseline plans only the bases), and each adapter's traffic counts
        # for its base too (traffic_keys), so a base whose adapters are busy keeps its memory.
        ids, self.bases, slots = self._catalog_view(catalog)
        self.feed_traffic(now, active)
        fleet = state.read_fleet(self.r, parsed=self._replicas, now=now)
        load_s, promote_s = measured_seconds(self.r, ids) if full else self.measured.medians(self.r, ids)
        delay = (load_times.median_delay(self.r.lrange(keys.DEMAND_DELAYS, 0, load_times.KEPT_DELAYS - 1)) if full
                 else self.measured.delay)
        pinned = overlays.pinned(self.r)
        models: dict[str, ModelSpec]
        cur = self._current
        fresh = None if full else self.measured.fresh
        todo: list[str]
        if cur is not None and fresh is not None and cur[0] is ids and cur[1] == pinned:
            # taken over, not copied: they are the copies the last read kept (never handed to anyone)
            models, self.refs, self._specs_now = cur[2], cur[3], cur[4]
            todo = fresh
        else:
            models, self.refs, self._specs_now = {}, {}, {}
            todo = ids
        for mid in todo:
            models[mid] = self._spec(mid, catalog.get(mid), load_s, pinned, promote_s=promote_s,
                                     slots=slots.get(mid, 0))
        self._current = (ids, pinned, dict(models), dict(self.refs), dict(self._specs_now))
        replicas_now = {mid: 0 for mid in ids}
        for rep in fleet.replicas():
            if rep.model in replicas_now and rep.state in (*rs.IN_FLIGHT, rs.READY):
                replicas_now[rep.model] += 1
        for mid, ro in rollouts.items():
            try:
                entry = catalog.get(mid, ro.version)
            except KeyError:
                continue  # the hook validated it; a catalog edit since then removed it
            if entry.version == catalog.get(mid).version:
                continue
            fraction = ro.traffic_fraction
            # Enough replicas of the new version for its share of the current version's load.
            need = max(1, math.ceil(fraction * max(1, replicas_now.get(mid, 0)))) if fraction > 0 else 0
            key = f"{mid}@{entry.version}"
            models[key] = self._spec(key, entry, load_s, pinned, min_replicas=need, promote_s=promote_s)
        replicas: list[ReplicaState] = []
        states_now: dict[int, tuple[state.Replica, str, str, str | None, ReplicaState]] = {}
        # The policy sees only the GPUs that take loads (state.Fleet.placeable): one whose heartbeat is late is
        # as good as gone to it (its records just have not expired yet), replicas and all, so it plans around.
        for g in fleet.placeable():
            for rep in g.replicas:
                if rep.state == rs.FAILED:
                    continue  # holds no memory; the worker keeps it only to show the reason
                key = self._old_version(models, catalog, rep.model, rep.version, load_s, pinned, promote_s)
                if key is None:
                    continue
                host = None
                if rep.host:  # an adapter, inside the base replica its record names ("model@version")
                    base_id, _, base_version = rep.host.rpartition("@")
                    host = model_key(catalog, base_id, base_version) if base_id in catalog else rep.host
                was = self._states.get(id(rep))
                if was is not None and was[0] is rep and was[1] == g.id and was[2] == key and was[3] == host:
                    rstate = was[4]
                else:
                    rstate = ReplicaState(model=key, gpu=g.id, state=rep.state, bytes=max(rep.bytes, rep.total_bytes),
                                       since=rep.created_at or rep.since, version=rep.version,
                                       last_request=rep.last_used, in_flight=rep.in_flight,
                                       ready_at=rep.ready_at, host=host)
                states_now[id(rep)] = (rep, g.id, key, host, rstate)
                replicas.append(rstate)
        self._states = states_now
        nodes: list[NodeState] = []
        staged: list[StagedState] = []
        for n in fleet.nodes:  # live nodes only: read_fleet drops a node whose heartbeat expired
            nodes.append(NodeState(id=n.node, budget_bytes=n.budget_bytes, free_bytes=n.free_bytes, alive=True))
            for x in n.staged:
                if x.state not in state.STAGED_STATES:
                    continue
                key = self._old_version(models, catalog, x.model, x.version, load_s, pinned, promote_s)
                if key is None:
                    continue
                staged.append(StagedState(model=key, node=n.node, state=x.state, bytes=max(x.bytes, x.total_bytes),
                                          since=x.staged_at, version=x.version))
        intents = []
        for it in state.read_intents(self.r):
            if it.model not in catalog:
                continue
            target: str | None = it.gpu
            if it.action in ("stage", "unstage"):
                target = state.host_node(it.gpu)  # claimed on host_id(node); the policy speaks of the node
            if target is None:
                continue
            key = model_key(catalog, it.model, it.version)
            size = models[key].size_bytes if key in models else 0
            intents.append(Intent(model=key, gpu=target, kind=it.action, expires_at=it.expires_at,
                                  bytes=size, version=it.version))
        self._specs = self._specs_now
        # The policy's memo (PolicyState) carries its timeline on only while `snapshot.models` is the same
        # object (timeline.advance compares ids): hand it last tick's dict when every spec is unchanged, so a
        # tick with nothing new in the catalog's view does not rebuild every model's timeline. The last dict
        # is held until this one is made, so a changed dict can never get the old one's id (a freed
        # object's id can be reused), which would carry on a timeline made for other specs.
        if self._models is not None and models == self._models:
            models = self._models
        self._models = models
        waiting_since = self._waiting(catalog, fleet, now)
        gpus = tuple(GpuState(id=g.id, node=g.node, total_bytes=g.total_bytes, free_bytes=g.free_bytes,
                              joined_at=g.started_at, alive=True) for g in fleet.placeable())
        snap = Snapshot(models=models, gpus=gpus, replicas=tuple(replicas), traffic=self.history,
                        intents=tuple(intents), recent_evictions=dict(self.recent_evictions),
                        waiting=dict.fromkeys(waiting_since, 1), waiting_since=waiting_since,
                        config=self.config, nodes=tuple(nodes), staged=tuple(staged), demand_delay_s=delay)
        return snap, fleet

