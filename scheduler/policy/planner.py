"""plan(): the warming policy. Pure: reads a Snapshot and `now`, returns actions; no I/O, no clock.

Order of work in one call (each step sees the tentative effect of the previous ones):
1. release quiet replicas (idle-time model says no request for a long while);
2. demand: a model with a request in the last demand_window_s and no replica → load it now,
   evicting the lowest expected value per byte if no GPU has room; every load goes to a GPU with
   fewer than max_loads_per_gpu loads in flight (loads sharing a link slow each other down, and
   every request waiting on them with it), so when all are busy it waits for the next tick, where
   the waiting model with the most requests per second of load time is placed first;
3. keep pinned / min_replicas models at their floor;
4. scale: forecast each capped model's rate one load time ahead, add replicas on other nodes;
5. a GPU that just joined takes replicas of the hottest models;
6. speculative: models in a "hot" segment of their idle-time timeline (a request is likely
   within their load time + a minute) are loaded ahead, within the speculative share of a GPU,
   evicting only residents worth `prefetch_margin` times less;
7. staging tier (only when the snapshot has host caches): models this call evicted and hot models
   that got no GPU are staged in a node's host memory, best value per byte first, replacing staged
   models worth `stage_margin` times less; a load of a staged model goes to its node (a promotion,
   `promote_seconds`, instead of a storage load), and a staged resident is the cheaper victim.

Value of a replica = expected cold requests per second its absence would cause
  = c × return rate, where
  c = 1 + requests arriving during a reload (requests per active minute × load time stretched by
      the fleet's current link contention) + requests its link time would hold up on other loads;
  return rate = 1 / E[time to next request | idle so far] from the idle-time model, or the
      10-minute measured rate if higher;
per byte when choosing victims. A GPU for a load is chosen by the fewest expected cold requests:
its victims' (capped at one reload each, over EVICTION_HORIZON_S) plus link contention.
A request that arrived before the model's last eviction is not demand (it was served).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import arrivals
from .arrivals import ArrivalModel
from .traffic import ewma_rate
from .types import (
    GIB,
    HOLDING_STATES,
    LOADING_STATES,
    Action,
    Evict,
    GpuState,
    Intent,
    ModelSpec,
    PolicyConfig,
    Preload,
    ReplicaState,
    Snapshot,
    Stage,
    StagedState,
    Unstage,
)

MAX_SPECULATIVE_TRIES = 24  # per tick, best first: bounds the work of one plan() call
MAX_STAGE_TRIES = 16  # per tick, best first
EVICTION_HORIZON_S = 60.0  # how far ahead an eviction's cost is counted when choosing a GPU


class _Value:
    """A model's loss() inputs that hold until its traffic changes (_advance drops the entry) or its
    idle time enters the next grid cell: the idle-time model's return rate there, the extra
    requests per active minute, and the long-rate EWMA's parts. `steady_from`: from this time on
    the long rate is below inv_mrl and stays there (it only decays), so loss() skips it."""

    __slots__ = ("spec", "anchor", "cell", "inv_mrl", "extra", "rate", "load_s", "steady_from")

    def __init__(self, spec: ModelSpec, anchor: float, cell: int, inv_mrl: float, extra: float,
                 rate: tuple[float, float, float, float], load_s: float) -> None:
        self.spec = spec
        self.anchor = anchor
        self.cell = cell
        self.inv_mrl = inv_mrl
        self.extra = extra
        self.rate = rate
        self.load_s = load_s
        self.steady_from = math.inf


@dataclass
class PolicyState:
    """Optional cache carried from one plan() call to the next (the caller keeps it).

    It holds only things derived from the traffic (per-model arrival models and a timeline of
    when each model becomes hot or cold), so plan(s, now, state) decides the same as
    plan(s, now) with a fresh state; it just does not recompute every model on every tick.
    Use one state per TrafficHistory; a different history or catalog object resets it.
    """

    traffic_id: int = 0
    models_id: int = 0
    seq: int = -1
    arrival: dict[str, tuple[tuple[int, float], ArrivalModel]] = field(default_factory=dict)
    hot_heap: list[tuple[float, str, float, float]] = field(default_factory=list)
    cold_heap: list[tuple[float, str, float, float]] = field(default_factory=list)
    awake: dict[str, tuple[float, float]] = field(default_factory=dict)  # model -> (end, arrival)
    due: dict[str, tuple[float, float]] = field(default_factory=dict)
    recent: dict[str, float] = field(default_factory=dict)  # model -> last arrival, for demand
    scheduled: dict[str, tuple[float, tuple[int, float]]] = field(default_factory=dict)  # model -> (anchor, timeline key)
    value: dict[str, _Value] = field(default_factory=dict)  # model -> loss() inputs (see _Value)
    config: PolicyConfig | None = None  # the config the cached arrival models were built with
    special: tuple[str, ...] = ()  # models with min_replicas / pinned / a rate cap


def load_seconds(spec: ModelSpec, cfg: PolicyConfig) -> float:
    return spec.load_seconds if spec.load_seconds is not None else cfg.default_load_seconds(spec.size_bytes)


def promote_seconds(spec: ModelSpec, cfg: PolicyConfig) -> float:
    """Load time from a node's host cache: measured, else derived; never more than from storage."""
    p = spec.promote_seconds if spec.promote_seconds is not None else cfg.default_promote_seconds(spec.size_bytes)
    return min(p, load_seconds(spec, cfg))


def _intent_bytes(it: Intent, snap: Snapshot) -> int:
    """What a preload or stage in flight will hold: its own figure, else the catalog's size."""
    return it.bytes or (snap.models[it.model].size_bytes if it.model in snap.models else 0)


class _Fleet:
    """Tentative view of the fleet for one plan() call."""

    def __init__(self, snap: Snapshot, now: float) -> None:
        cfg = snap.config
        self.gpus: dict[str, GpuState] = {g.id: g for g in snap.gpus if g.alive}
        self.used: dict[str, int] = dict.fromkeys(self.gpus, 0)
        self.spec: dict[str, int] = dict.fromkeys(self.gpus, 0)
        self.loading: dict[str, int] = dict.fromkeys(self.gpus, 0)
        self.pending_intent: dict[str, int] = dict.fromkeys(self.gpus, 0)
        self.on_gpu: dict[str, dict[str, ReplicaState]] = {g: {} for g in self.gpus}
        self.of_model: dict[str, list[str]] = {}
        self.evicting: set[tuple[str, str]] = set()
        self.victims: dict[str, list[tuple[float, str, ReplicaState]]] = {}  # lazily sorted per gpu
        self.loading_models: dict[str, list[str]] = {g: [] for g in self.gpus}  # in the snapshot
        traffic = snap.traffic
        used, spec, loading, on_gpu, of_model = self.used, self.spec, self.loading, self.on_gpu, self.of_model
        for r in snap.replicas:
            g = r.gpu
            st = r.state
            if g not in used or st not in HOLDING_STATES:
                continue
            used[g] += r.bytes
            if st in LOADING_STATES and r.model not in on_gpu[g]:
                self.loading_models[g].append(r.model)
            on_gpu[g][r.model] = r
            if st == "evicting":
                self.evicting.add((r.model, g))
                continue
            gl = of_model.get(r.model)
            if gl is None:
                of_model[r.model] = [g]
            else:
                gl.append(g)
            if st != "ready":
                loading[g] += 1
            lr = r.last_request
            if lr is None or lr < r.since:
                a = traffic.last_arrival(r.model)
                if a is None or a < r.since:
                    spec[g] += r.bytes
        for it in snap.intents:
            if it.gpu not in self.gpus or it.expires_at <= now:
                continue
            if it.kind == "evict":
                self.evicting.add((it.model, it.gpu))
            elif it.model not in self.on_gpu[it.gpu]:
                size = _intent_bytes(it, snap)
                self.used[it.gpu] += size
                self.pending_intent[it.gpu] += size
                self.loading[it.gpu] += 1
                self.of_model.setdefault(it.model, []).append(it.gpu)
        # The staging tier: each live node's host cache (only nodes that still have a live GPU).
        gpu_nodes = {g.node for g in self.gpus.values()}
        self.nodes = {n.id: n for n in snap.nodes if n.alive and n.id in gpu_nodes}
        self.host_used: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.host_pending: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.stages_in_flight: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.on_host: dict[str, dict[str, StagedState | None]] = {n: {} for n in self.nodes}  # None: intent
        self.staged_nodes: dict[str, set[str]] = {}  # model -> nodes holding it ready to promote
        self.unstaging: set[tuple[str, str]] = set()
        for x in snap.staged:
            if x.node not in self.nodes:
                continue
            self.host_used[x.node] += x.bytes
            self.on_host[x.node][x.model] = x
            if x.state == "staged":
                self.staged_nodes.setdefault(x.model, set()).add(x.node)
            else:
                self.stages_in_flight[x.node] += 1
        for it in snap.intents:
            if it.kind not in ("stage", "unstage") or it.gpu not in self.nodes or it.expires_at <= now:
                continue
            if it.kind == "unstage":
                self.unstaging.add((it.model, it.gpu))
            elif it.model not in self.on_host[it.gpu]:
                size = _intent_bytes(it, snap)
                self.host_used[it.gpu] += size
                self.host_pending[it.gpu] += size
                self.stages_in_flight[it.gpu] += 1
                self.on_host[it.gpu][it.model] = None
        self.cfg = cfg

    def host_avail(self, node: str) -> int:
        n = self.nodes[node]
        return min(n.budget_bytes - self.host_used[node], n.free_bytes - self.host_pending[node])

    def avail(self, gpu: str) -> int:
        g = self.gpus[gpu]
        # the tighter of our accounting and the worker's measured free bytes (less what this
        # call and unconfirmed intents will load, plus what this call evicts)
        return min(g.total_bytes - self.used[gpu], g.free_bytes - self.pending_intent[gpu])

    def count(self, model: str) -> int:
        return len(self.of_model.get(model, ()))


class _Planner:
    def __init__(self, snap: Snapshot, now: float, state: PolicyState) -> None:
        self.s = snap
        self.now = now
        self.cfg = snap.config
        self.st = state
        self.tr = snap.traffic
        self.fleet = _Fleet(snap, now)
        self.actions: list[Action] = []
        self._loss: dict[str, float] = {}
        self._loading_rate: dict[str, float] = {}
        self._link_rate: float | None = None
        self.grid_s = snap.config.grid_s
        self.evicted_now: list[str] = []  # models this call evicts: candidates to keep in host memory
        self.host_victims: dict[str, list[tuple[float, str, StagedState]]] = {}  # node -> staged, by value per byte
        # loads in flight per GPU stretch every load: 1 + the mean number already loading
        n = len(self.fleet.gpus)
        self.slowdown = 1.0 + (sum(self.fleet.loading.values()) / n if n else 0.0)
        self.floors = {m for m in state.special if snap.models[m].pinned or snap.models[m].min_replicas > 0} \
            if state.models_id == id(snap.models) else {m for m, sp in snap.models.items()
                                                        if sp.pinned or sp.min_replicas > 0}

    # ---- per-model numbers ---------------------------------------------------------------
    def arrival(self, model: str) -> ArrivalModel:
        spec = self.s.models[model]
        stable = self.tr.stable_histogram(model)
        key = (0 if stable is None else stable[0], load_seconds(spec, self.cfg))
        hit = self.st.arrival.get(model)
        if hit is not None and hit[0] == key:
            return hit[1]
        am = arrivals.build(None if stable is None else stable[1], 0.0 if stable is None else stable[2],
                            key[1], self.cfg)
        self.st.arrival[model] = (key, am)
        return am

    def request_rate(self, model: str) -> float:
        """Requests/s now: the short-window rate, or the mean per active minute if higher (a model
        that comes in bursts is busy while it is asked for)."""
        return max(self.tr.rate_short(model, self.now), self.tr.stable_requests_per_active_minute(model) / 60.0)

    def cost(self, model: str) -> float:
        """Cold requests one reload costs: the first request plus those arriving during the load,
        which takes the load time stretched by the fleet's current link contention."""
        spec = self.s.models.get(model)
        if spec is None:
            return 1.0  # dropped from the catalog: nothing will reload it
        rpm = self.tr.stable_requests_per_active_minute(model)
        return 1.0 + max(0.0, rpm - 1.0) * min(self.reload_s(spec) * self.slowdown, 60.0) / 60.0

    def reload_s(self, spec: ModelSpec) -> float:
        """How long the next load of this model takes: from a node's host cache if it is staged."""
        if spec.id in self.fleet.staged_nodes:
            return promote_seconds(spec, self.cfg)
        return load_seconds(spec, self.cfg)

    def anchor(self, model: str) -> float | None:
        """Last arrival rounded down to the timeline grid: the idle-time model's origin. Rounding
        lets a busy model's timeline be rescheduled once per grid step, not on every request."""
        a = self.tr.last_arrival(model)
        return None if a is None else math.floor(a / self.cfg.grid_s) * self.cfg.grid_s

    def idle(self, model: str) -> float | None:
        a = self.anchor(model)
        return None if a is None else max(0.0, self.now - a)

    def loss(self, model: str) -> float:
        """Expected cold requests per second if this model were not resident."""
        v = self._loss.get(model)
        if v is not None:
            return v
        spec = self.s.models.get(model)
        now = self.now
        e = self.st.value.get(model)
        if e is None or e.spec is not spec or e.cell != int(max(0.0, now - e.anchor) // self.grid_s):
            e = self._value_inputs(model, spec)
            if e is None:  # never requested, or dropped from the catalog
                self._loss[model] = 0.0
                return 0.0
        # return rate: the idle-time model's, or the measured recent rate if higher (the
        # histogram's 1-minute bins cannot tell 1 request/s from 1 every 30 s)
        if now >= e.steady_from:
            rate = e.inv_mrl
        else:
            rate = ewma_rate(*e.rate, now)
            if rate <= e.inv_mrl:
                rate = e.inv_mrl
                e.steady_from = now
        # a reload from host memory is cheaper: a staged model is worth less kept
        ld = promote_seconds(e.spec, self.cfg) if model in self.fleet.staged_nodes else e.load_s
        # own cold requests during the (stretched) reload, plus the requests its link time
        # would hold up on loads sharing the link then (judged by those waiting now)
        link = self._link_rate if self._link_rate is not None else self.link_rate()
        v = rate * (1.0 + e.extra * min(ld * self.slowdown, 60.0) / 60.0 + link * ld)
        self._loss[model] = v
        return v

    def _value_inputs(self, model: str, spec: ModelSpec | None) -> _Value | None:
        got = self.tr.value_inputs(model)
        if got is None or spec is None:
            self.st.value.pop(model, None)
            return None
        last, rate = got
        g = self.grid_s
        anchor = (last // g) * g
        am = self.arrival(model)
        extra = max(0.0, self.tr.stable_requests_per_active_minute(model) - 1.0)
        e = _Value(spec, anchor, int(max(0.0, self.now - anchor) // g),
                   1.0 / max(am.mrl_at(max(0.0, self.now - anchor)), 1.0), extra, rate, load_seconds(spec, self.cfg))
        self.st.value[model] = e
        return e

    # ---- fleet helpers -------------------------------------------------------------------
    def evictable(self, r: ReplicaState) -> bool:
        spec = self.s.models.get(r.model)
        if r.state != "ready" or r.in_flight > 0 or (r.model, r.gpu) in self.fleet.evicting:
            return False
        if self.now - r.since < self.cfg.min_residency_s:
            return False
        if spec is None:
            return True  # not in the catalog any more: nothing protects it
        floor = max(spec.min_replicas, 1 if spec.pinned else 0)
        return not spec.pinned and self.fleet.count(r.model) > floor

    def victim_list(self, gpu: str) -> list[tuple[float, str, ReplicaState]]:
        v = self.fleet.victims.get(gpu)
        if v is None:
            v = []
            f = self.fleet
            models = self.s.models
            evicting = f.evicting
            young = self.now - self.cfg.min_residency_s
            of_model = f.of_model
            known = self._loss
            loss = self.loss
            for m, r in f.on_gpu[gpu].items():
                # evictable(), inlined: this loop is the policy's hot path
                if r.state != "ready" or r.in_flight > 0 or r.since > young or (evicting and (m, gpu) in evicting):
                    continue
                spec = models.get(m)
                n = len(of_model.get(m, ()))
                if spec is not None and (spec.pinned or n <= spec.min_replicas):
                    continue
                value = known.get(m)
                if value is None:
                    value = loss(m)
                v.append((value / max(1, n) / max(r.bytes / GIB, 1e-3), m, r))
            v.sort()  # (value, model) is unique on a GPU: the replica is never compared
            self.fleet.victims[gpu] = v
        return v

    def is_speculative(self, r: ReplicaState) -> bool:
        """Loaded ahead of demand and not asked for since it started loading."""
        if r.last_request is not None and r.last_request >= r.since:
            return False
        a = self.tr.last_arrival(r.model)
        return a is None or a < r.since

    def link_rate(self) -> float:
        """Requests per second waiting on loads, per GPU link: what one link-second holds up."""
        if self._link_rate is None:
            n = len(self.fleet.gpus)
            self._link_rate = sum(self.loading_rate(g) for g in sorted(self.fleet.gpus)) / n if n else 0.0
        return self._link_rate

    def loading_rate(self, gpu: str) -> float:
        """Sum of request rates of the models loading on a GPU (their requests wait on the link)."""
        v = self._loading_rate.get(gpu)
        if v is None:
            v = sum(max(self.tr.rate_short(m, self.now), 1e-3) for m in self.fleet.loading_models[gpu])
            self._loading_rate[gpu] = v
        return v

    def do_evict(self, r: ReplicaState, kind: str, reason: str, numbers: dict[str, float]) -> None:
        f = self.fleet
        f.used[r.gpu] -= r.bytes
        f.pending_intent[r.gpu] -= r.bytes
        f.evicting.add((r.model, r.gpu))
        gl = f.of_model.get(r.model, [])
        if r.gpu in gl:
            gl.remove(r.gpu)
        del f.on_gpu[r.gpu][r.model]
        if self.is_speculative(r):
            f.spec[r.gpu] -= r.bytes
        vl = f.victims.get(r.gpu)
        if vl is not None:
            f.victims[r.gpu] = [x for x in vl if x[2] is not r]
        self.evicted_now.append(r.model)
        self.actions.append(Evict(r.model, r.gpu, kind, reason, numbers, r.version))

    def do_preload(self, spec: ModelSpec, gpu: str, kind: str, reason: str, numbers: dict[str, float]) -> None:
        f = self.fleet
        f.used[gpu] += spec.size_bytes
        f.pending_intent[gpu] += spec.size_bytes
        f.loading[gpu] += 1
        if kind == "speculative":
            f.spec[gpu] += spec.size_bytes
        f.of_model.setdefault(spec.id, []).append(gpu)  # a load is never a victim: orders stay valid
        self._loading_rate[gpu] = self.loading_rate(gpu) + max(self.tr.rate_short(spec.id, self.now), 1e-3)
        self.actions.append(Preload(spec.id, gpu, kind, reason, numbers, spec.version, spec.size_bytes))

    def place(self, spec: ModelSpec, kind: str, benefit: float = math.inf) -> tuple[str, list, float] | None:
        """Choose a GPU (and victims) for one more replica of spec. Returns (gpu, victims, loss)."""
        f = self.fleet
        cfg = self.cfg
        size = spec.size_bytes
        speculative = kind == "speculative"
        hosting = f.of_model.get(spec.id, [])
        ld_storage = load_seconds(spec, cfg)
        rate = self.request_rate(spec.id)
        nodes_with = {f.gpus[g].node for g in hosting if g in f.gpus}
        # Nodes holding it in host memory: a load there is a promotion, not a storage read.
        staged_on = f.staged_nodes.get(spec.id, ())
        ld_host = promote_seconds(spec, cfg) if staged_on else ld_storage
        best: tuple | None = None
        order = sorted(f.gpus)
        if not speculative:
            # an idle GPU with room on a node without this model costs nothing: no need to
            # cost evictions elsewhere (on a node that has it staged, if there is one)
            easy = [gid for gid in order if gid not in hosting and f.loading[gid] == 0
                    and f.gpus[gid].node not in nodes_with and f.avail(gid) >= size
                    and (spec.id, gid) not in f.evicting]
            easy = [gid for gid in easy if f.gpus[gid].node in staged_on] or easy
            if easy:
                order = easy
        # Cost = victims (>= 0) + link contention, so (node spread, contention) is a lower bound on
        # a GPU's key: visit GPUs in that order and stop once the bound passes the best found.
        bounded = []
        for gid in order:
            g = f.gpus[gid]
            if gid in hosting or g.total_bytes < size or (spec.id, gid) in f.evicting:
                continue
            if speculative and f.loading[gid] >= cfg.max_speculative_loads_per_gpu:
                continue
            if cfg.max_loads_per_gpu and f.loading[gid] >= cfg.max_loads_per_gpu:
                continue
            k = f.loading[gid]
            ld = ld_host if g.node in staged_on else ld_storage
            contention = ld * (rate * k + self.loading_rate(gid)) if k else 0.0
            if staged_on:
                # where the load time differs by GPU, count our own requests waiting through it
                contention += rate * ld
            bounded.append((g.node in nodes_with, contention, gid))
        bounded.sort()
        for spread, contention, gid in bounded:
            if best is not None and (spread, contention) > best[0][:2]:
                break
            g = f.gpus[gid]
            spec_cap = cfg.speculative_share * g.total_bytes
            free = f.avail(gid)
            victims: list[ReplicaState] = []
            loss = 0.0
            if free < size:
                freed = 0
                spec_freed = 0
                for vpb, _m, r in self.victim_list(gid):
                    if r.model in self.floors and not self.evictable(r):
                        continue  # its replica count dropped to its floor during this call
                    if speculative and vpb * r.bytes / GIB * cfg.prefetch_margin > benefit:
                        break  # this victim alone is worth more than the prefetch
                    victims.append(r)
                    freed += r.bytes
                    loss += vpb * r.bytes / GIB
                    if self.is_speculative(r):
                        spec_freed += r.bytes
                    if free + freed >= size:
                        break
                if free + freed < size:
                    continue
                if speculative and f.spec[gid] - spec_freed + size > spec_cap:
                    continue
            elif speculative and f.spec[gid] + size > spec_cap:
                continue
            # Expected cold requests this choice causes: the victims' next reloads (their loss rate
            # over the eviction horizon, at most one reload each) plus load-link contention: k
            # loads in flight make ours ~k× slower (our requests wait through it) and each of
            # theirs slower by about our load time (theirs wait too).
            cost = contention + sum(
                min(self.cost(r.model), self.loss(r.model) * EVICTION_HORIZON_S) for r in victims)
            key = (spread, cost, f.loading[gid], free - size, gid)
            if best is None or key < best[0]:
                best = (key, gid, victims, loss)
        if best is None:
            return None
        if speculative and best[3] * cfg.prefetch_margin > benefit:
            return None
        return best[1], best[2], best[3]

    def load(self, spec: ModelSpec, kind: str, reason: str, numbers: dict[str, float],
             benefit: float = math.inf) -> bool:
        choice = self.place(spec, kind, benefit)
        if choice is None:
            return False
        self.commit(spec, kind, choice, reason, numbers)
        return True

    def commit(self, spec: ModelSpec, kind: str, choice: tuple[str, list, float], reason: str,
               numbers: dict[str, float]) -> None:
        """Record place()'s choice: its evictions, then the preload."""
        gid, victims, _loss = choice
        for r in victims:
            d = self.idle(r.model)
            mrl = self.arrival(r.model).mrl_at(d) if d is not None and r.model in self.s.models else math.inf
            val = self.loss(r.model)
            self.do_evict(
                r, "make_room",
                f"make room on {gid} for {spec.id} ({kind}): lowest value per byte here — "
                f"idle {_fmt_s(d)}, next request expected in {_fmt_s(mrl)}, "
                f"{val:.3g} cold req/s if absent, {r.bytes / GIB:.1f} GiB",
                {"idle_s": _num(d), "expected_next_s": _num(mrl), "loss_per_s": val,
                 "gib": r.bytes / GIB},
            )
        node = self.fleet.gpus[gid].node
        if node in self.fleet.staged_nodes.get(spec.id, ()):
            self.do_preload(spec, gid, kind,
                            f"{reason} → preload on {gid}, promoted from {node}'s host cache in "
                            f"~{promote_seconds(spec, self.cfg):.1f} s", {**numbers, "from_host": 1.0})
        else:
            self.do_preload(spec, gid, kind, f"{reason} → preload on {gid}", numbers)

    # ---- the staging tier ----------------------------------------------------------------
    def host_victim_list(self, node: str) -> list[tuple[float, str, StagedState]]:
        """Staged models on a node that could make room, lowest value per byte first."""
        v = self.host_victims.get(node)
        if v is None:
            f = self.fleet
            v = []
            for m, x in f.on_host[node].items():
                if x is None or x.state != "staged" or (m, node) in f.unstaging:
                    continue
                if any(f.gpus[g].node == node and f.on_gpu[g].get(m) is not None
                       and f.on_gpu[g][m].state in LOADING_STATES for g in f.of_model.get(m, ())):
                    continue  # a promotion may be reading it right now
                vpb = self.loss(m) / max(x.bytes / GIB, 1e-3) if m in self.s.models else 0.0
                v.append((vpb, m, x))
            v.sort()
            self.host_victims[node] = v
        return v

    def do_stage(self, spec: ModelSpec, node: str, kind: str, reason: str, numbers: dict[str, float],
                 value: float) -> None:
        f = self.fleet
        f.host_used[node] += spec.size_bytes
        f.host_pending[node] += spec.size_bytes
        f.stages_in_flight[node] += 1
        f.on_host[node][spec.id] = None
        self.actions.append(Stage(spec.id, node, kind, reason, numbers, spec.version, spec.size_bytes, value))

    def do_unstage(self, x: StagedState, kind: str, reason: str, numbers: dict[str, float]) -> None:
        f = self.fleet
        model, node = x.model, x.node
        f.host_used[node] -= x.bytes
        f.host_pending[node] -= x.bytes
        del f.on_host[node][model]
        f.unstaging.add((model, node))
        nodes = f.staged_nodes.get(model)
        if nodes is not None:
            nodes.discard(node)
            if not nodes:
                del f.staged_nodes[model]
        hv = self.host_victims.get(node)
        if hv is not None:
            self.host_victims[node] = [e for e in hv if e[1] != model]
        self.actions.append(Unstage(model, node, kind, reason, numbers, x.version))

    def step_stage(self, candidates: Iterable[str]) -> None:
        """Keep models whose demand is likely but not imminent in a node's host memory: a later load
        there is a promotion (host → device), not a storage read. Candidates are models just evicted
        from their GPUs and models in a hot segment that got no GPU this tick; the cache keeps the
        highest expected value per byte, replacing staged models worth `stage_margin` times less."""
        f = self.fleet
        cfg = self.cfg
        if not f.nodes:
            return
        cands = []
        for m in set(candidates):
            spec = self.s.models.get(m)
            if spec is None or f.count(m) > 0 or any(m in f.on_host[n] for n in f.nodes):
                continue
            v = self.loss(m)
            if v > 0.0:
                cands.append((-v / max(spec.size_bytes / GIB, 1e-3), m, v))
        cands.sort()
        for negvpb, m, v in cands[:MAX_STAGE_TRIES]:
            spec = self.s.models[m]
            vpb = -negvpb
            best: tuple | None = None
            for node in sorted(f.nodes):
                if f.stages_in_flight[node] >= cfg.max_stages_per_node:
                    continue
                if f.nodes[node].budget_bytes < spec.size_bytes:
                    continue
                free = f.host_avail(node)
                victims: list[tuple[float, str, StagedState]] = []
                if free < spec.size_bytes:
                    freed = 0
                    for e in self.host_victim_list(node):
                        if e[0] * cfg.stage_margin >= vpb:
                            break  # what is there is worth keeping
                        victims.append(e)
                        freed += e[2].bytes
                        if free + freed >= spec.size_bytes:
                            break
                    if free + freed < spec.size_bytes:
                        continue
                key = (bool(victims), max((e[0] for e in victims), default=0.0), -free, node)
                if best is None or key < best[0]:
                    best = (key, node, victims)
            if best is None:
                continue
            _key, node, victims = best
            for evpb, _em, ex in victims:
                self.do_unstage(ex, "make_room",
                                f"make room in {node}'s host cache for {m}: lowest value per byte here "
                                f"({evpb:.3g} vs {vpb:.3g} cold req/s per GiB), {ex.bytes / GIB:.1f} GiB",
                                {"value_per_gib": evpb, "gib": ex.bytes / GIB})
            d = self.idle(m)
            am = self.arrival(m)
            mrl = am.mrl_at(d) if d is not None else math.inf
            kind = "demote" if m in self.evicted_now else "likely"
            self.do_stage(
                spec, node, kind,
                f"{'evicted from its GPUs' if kind == 'demote' else 'likely soon, no GPU free'}; "
                f"idle {_fmt_s(d)}, next request expected in {_fmt_s(mrl)}, {v:.3g} cold req/s if absent; "
                f"a promotion from host takes ~{promote_seconds(spec, cfg):.1f} s instead of "
                f"{load_seconds(spec, cfg):.1f} s → stage in {node}'s host cache",
                {"idle_s": _num(d), "expected_next_s": _num(mrl), "loss_per_s": v,
                 "promote_s": promote_seconds(spec, cfg), "load_s": load_seconds(spec, cfg)},
                v,
            )

    # ---- steps ---------------------------------------------------------------------------
    def step_release(self, due: Iterable[str]) -> None:
        for m in sorted(due):
            if m not in self.s.models:
                continue
            d = self.idle(m)
            if d is None:
                continue
            am = self.arrival(m)
            for gid in sorted(self.fleet.of_model.get(m, [])):
                r = self.fleet.on_gpu[gid].get(m)
                if r is None or not self.evictable(r):
                    continue
                p = am.p_at(d)
                self.do_evict(
                    r, "quiet",
                    f"quiet: idle {_fmt_s(d)}; idle-time histogram ({am.samples:.0f} gaps) gives "
                    f"P(request within the next {_fmt_s(self.cfg.window_s)})={p:.3f} for at least "
                    f"{_fmt_s(self.cfg.release_min_gap_s)}; next request expected in {_fmt_s(am.mrl_at(d))}",
                    {"idle_s": d, "p_soon": p, "expected_next_s": _num(am.mrl_at(d)), "gaps": am.samples},
                )

    def rates(self, m: str) -> tuple[float, float, bool]:
        rs = self.tr.rate_short(m, self.now)
        rl = self.tr.rate_long(m, self.now)
        rising = rs >= self.cfg.rise_floor_per_s and rs > self.cfg.rise_factor * rl
        return rs, rl, rising

    def forecast(self, m: str, ahead: float) -> float:
        """Linear trend from the two EWMAs (their centres lag by their time constants)."""
        rs = self.tr.rate_short(m, self.now)
        rl = self.tr.rate_long(m, self.now)
        ls = self.tr.lag(m, self.now, self.cfg.short_window_s)
        ll = self.tr.lag(m, self.now, self.cfg.long_window_s)
        # trust a trend only when the windows see different pasts and the rise is clear of noise;
        # before the long window has history, use the panic window against the short one
        if ll - ls >= 30.0:
            slope = (rs - rl) / (ll - ls) if rs > 1.1 * rl else 0.0
            return max(0.0, rs + slope * (ls + ahead))
        rp = self.tr.rate_panic(m, self.now)
        lp = self.tr.lag(m, self.now, self.cfg.panic_window_s)
        slope = (rp - rs) / (ls - lp) if ls - lp >= 5.0 and rp > 1.1 * rs else 0.0
        return max(0.0, rp + slope * (lp + ahead))

    def step_demand(self, recent: Iterable[str]) -> None:
        cands = []
        for m in recent:
            spec = self.s.models.get(m)
            if spec is None or self.fleet.count(m) > 0:
                continue
            a = self.tr.last_arrival(m)
            if m not in self.s.waiting:
                # a recent request with no replica is unmet demand — unless it came before the
                # model's last eviction (it was served; reloading now would only undo the eviction)
                if a is None or self.now - a > self.cfg.demand_window_s:
                    continue
                ev = self.s.recent_evictions.get(m)
                if ev is not None and a + 1.0 <= ev:
                    continue
            # Smith's rule: most requests per second of load time first, which keeps the requests
            # arriving while loads wait for a slot and run to a minimum
            rate = max(self.request_rate(m), 1e-6)
            cands.append((-rate / load_seconds(spec, self.cfg), m))
        failed_size = math.inf  # placement is monotone in size for demand: skip what cannot fit
        for _c, m in sorted(cands):
            spec = self.s.models[m]
            if spec.size_bytes >= failed_size:
                continue
            choice = self.place(spec, "demand")
            if choice is None:
                failed_size = float(spec.size_bytes)
                continue
            # the reason is built only for a load that goes ahead
            rs, rl, rising = self.rates(m)
            ld = load_seconds(spec, self.cfg)
            trend = f" rising ×{rs / rl:.1f} vs {_fmt_s(self.cfg.long_window_s)} mean" if rising and rl > 0 else ""
            fc = self.forecast(m, ld)
            self.commit(
                spec, "demand", choice,
                f"{self.s.waiting.get(m, 1)} request(s) waiting (last {_fmt_s(self.now - (self.tr.last_arrival(m) or self.now))} ago), "
                f"no replica; rate {rs:.2f}/s{trend}; "
                f"forecast {fc:.2f}/s in {ld:.0f} s; load {ld:.1f} s",
                {"rate_short": rs, "rate_long": rl, "forecast": fc, "load_s": ld},
            )

    def step_floor(self) -> None:
        for m in self.st.special:
            spec = self.s.models.get(m)
            if spec is None:
                continue
            floor = max(spec.min_replicas, 1 if spec.pinned else 0)
            while self.fleet.count(m) < floor:
                have = self.fleet.count(m)
                if not self.load(spec, "min_replicas",
                                 f"{'pinned, ' if spec.pinned else ''}min_replicas {floor}, has {have}",
                                 {"min_replicas": floor, "replicas": have}):
                    break

    def step_scale(self) -> None:
        for m in self.st.special:
            spec = self.s.models.get(m)
            if spec is None or not spec.max_rate_per_replica or self.fleet.count(m) == 0:
                continue
            ld = load_seconds(spec, self.cfg)
            fc = self.forecast(m, ld + self.cfg.tick_s)
            rs, rl, rising = self.rates(m)
            # 5 % tolerance: a rate sitting exactly at n × capacity needs n replicas, not n + 1
            want = max(1, math.ceil(max(fc, rs) / spec.max_rate_per_replica - 0.05))
            while self.fleet.count(m) < want:
                have = self.fleet.count(m)
                trend = f" rising ×{rs / rl:.1f} vs {_fmt_s(self.cfg.long_window_s)} mean;" if rising and rl > 0 else ";"
                if not self.load(
                    spec, "scale",
                    f"rate {rs:.2f}/s{trend} forecast {fc:.2f}/s in {ld + self.cfg.tick_s:.0f} s "
                    f"> {have} × {spec.max_rate_per_replica:g}/s per replica; load {ld:.1f} s",
                    {"rate_short": rs, "rate_long": rl, "forecast": fc, "replicas": have,
                     "want": want, "load_s": ld},
                ):
                    break

    def step_new_gpu(self) -> None:
        cfg = self.cfg
        fresh = [g for g in sorted(self.fleet.gpus)
                 if 0 <= self.now - self.fleet.gpus[g].joined_at < cfg.new_gpu_window_s]
        if not fresh:
            return
        hot = sorted(
            ((-self.tr.rate_short(m, self.now), m) for m in self.tr.models() if m in self.s.models),
        )
        hot = [(r, m) for r, m in hot if r < 0][: cfg.new_gpu_hot_models]
        fresh_set = set(fresh)
        for gid in fresh:
            g = self.fleet.gpus[gid]
            for negr, m in hot:
                spec = self.s.models[m]
                hosts = self.fleet.of_model.get(m, [])
                if gid in hosts or m in self.fleet.on_gpu[gid]:
                    continue
                if any(h in fresh_set for h in hosts):
                    continue  # GPUs joining together (a fleet starting cold) share the hottest, not copy them
                if self.fleet.avail(gid) < spec.size_bytes:
                    continue
                if self.fleet.spec[gid] + spec.size_bytes > cfg.speculative_share * g.total_bytes:
                    continue
                self.do_preload(
                    spec, gid, "new_gpu",
                    f"{gid} joined {_fmt_s(self.now - g.joined_at)} ago; {m} is among the "
                    f"{cfg.new_gpu_hot_models} hottest models at {-negr:.2f}/s → preload on {gid}",
                    {"rate_short": -negr},
                )
                self.fleet.spec[gid] += spec.size_bytes  # unrequested on this GPU: count as speculative

    def step_speculative(self, awake: dict[str, tuple[float, float]]) -> None:
        """`awake`: the state's hot segments (model -> (end, anchor)); ended ones are dropped here."""
        cfg = self.cfg
        cands = []
        now = self.now
        models = self.s.models
        of_model = self.fleet.of_model
        for m in sorted(awake):
            end, anchor = awake[m]  # (_advance drops an entry whose model's timeline moved)
            if end <= now:
                del awake[m]  # the segment ended
                continue
            if of_model.get(m):
                continue
            spec = models.get(m)
            if spec is None:
                continue
            ev = self.s.recent_evictions.get(m)
            if ev is not None and now - ev < cfg.eviction_cooldown_s:
                continue
            d = max(0.0, now - anchor)
            am = self.arrival(m)
            if am.segment_at(d) != "hot":
                continue
            cands.append((-self.loss(m), m))
        cands.sort()
        for negl, m in cands[:MAX_SPECULATIVE_TRIES]:
            if all(n >= cfg.max_speculative_loads_per_gpu for n in self.fleet.loading.values()):
                break  # every GPU's load bandwidth is taken
            spec = self.s.models[m]
            choice = self.place(spec, "speculative", -negl)
            if choice is None:
                continue
            d = self.idle(m) or 0.0
            am = self.arrival(m)
            ld = load_seconds(spec, cfg)
            p = am.p_at(d)
            self.commit(
                spec, "speculative", choice,
                f"idle {_fmt_s(d)}; idle-time histogram ({am.samples:.0f} gaps) gives "
                f"P(request within {_fmt_s(ld + cfg.tick_s + 5 + cfg.window_s)})={p:.2f}, next expected in "
                f"{_fmt_s(am.mrl_at(d))}; {self.cost(m):.1f} cold requests per reload; load {ld:.1f} s",
                {"idle_s": d, "p_soon": p, "expected_next_s": _num(am.mrl_at(d)),
                 "loss_per_s": -negl, "load_s": ld, "gaps": am.samples},
            )


def _fmt_s(x: float | None) -> str:
    if x is None or math.isinf(x):
        return "never"
    if x < 120:
        return f"{x:.0f} s"
    if x < 7200:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.1f} h"


def _num(x: float | None) -> float:
    return -1.0 if x is None or math.isinf(x) else float(x)


def _schedule(pl: _Planner, m: str) -> None:
    """Push the model's future hot/cold segments (relative to its last arrival) onto the heaps."""
    st = pl.st
    last = pl.tr.last_arrival(m)
    if last is None:
        return
    st.recent[m] = last
    a = math.floor(last / pl.grid_s) * pl.grid_s  # anchor(), with the arrival already read
    am = pl.arrival(m)
    key = (a, st.arrival[m][0])
    if st.scheduled.get(m) == key:
        return  # same origin, same timeline: the heaps already hold it
    st.scheduled[m] = key
    now = pl.now
    for start, end, label in am.segments:
        if a + end <= now:
            continue
        heap = st.hot_heap if label == "hot" else st.cold_heap
        heapq.heappush(heap, (a + start, m, a, a + end))


def _advance(pl: _Planner) -> None:
    """Bring the state's timeline up to `now` and the traffic's latest changes."""
    st, snap, tr, now = pl.st, pl.s, pl.tr, pl.now
    new_config = st.config is not snap.config and st.config != snap.config
    fresh = st.traffic_id != id(tr) or st.models_id != id(snap.models) or st.seq < 0 or new_config
    if fresh:
        if st.traffic_id != id(tr) or new_config:
            # arrival models and value inputs are keyed by histogram version and load time (or
            # spec), so they survive a new catalog object (a live scheduler may rebuild it every tick)
            st.arrival.clear()
            st.value.clear()
        st.traffic_id, st.models_id, st.config = id(tr), id(snap.models), snap.config
        st.hot_heap.clear()
        st.cold_heap.clear()
        st.awake.clear()
        st.due.clear()
        st.recent.clear()
        st.scheduled.clear()
        st.special = tuple(sorted(
            m for m, s in snap.models.items() if s.pinned or s.min_replicas > 0 or s.max_rate_per_replica
        ))
        changed = tr.models()
    else:
        since = tr.changed_since(st.seq)
        changed = tr.models() if since is None else since
    st.seq = tr.seq
    # a request moves a model's timeline: its hot/cold segments from the old anchor no longer hold,
    # nor do its value inputs
    value = st.value
    for m in changed:
        value.pop(m, None)
        for segs in (st.awake, st.due):
            seg = segs.get(m)
            if seg is not None and seg[1] != pl.anchor(m):
                del segs[m]
    for m in sorted(set(changed)):
        if m in snap.models:
            _schedule(pl, m)
    for heap, target in ((st.hot_heap, st.awake), (st.cold_heap, st.due)):
        while heap and heap[0][0] <= now:
            _start, m, a, end = heapq.heappop(heap)
            if end > now and pl.anchor(m) == a:
                target[m] = (end, a)
    for m in [m for m, (end, _a) in st.due.items() if end <= now]:
        del st.due[m]
    cutoff = now - pl.cfg.demand_window_s
    for m in [m for m, a in st.recent.items() if a < cutoff]:
        del st.recent[m]


def plan(snapshot: Snapshot, now: float, state: PolicyState | None = None) -> list[Action]:
    """Decide the preloads and evictions for this tick. See the package docstring."""
    st = state if state is not None else PolicyState()
    pl = _Planner(snapshot, now, st)
    _advance(pl)
    # Only resident models can be released; others leave the due set (they re-enter on arrival).
    due = []
    for m in list(st.due):
        if m in pl.fleet.of_model and pl.fleet.of_model[m]:
            due.append(m)
        else:
            del st.due[m]
    pl.step_release(due)
    pl.step_demand(sorted(set(st.recent) | set(snapshot.waiting)))
    pl.step_floor()
    pl.step_scale()
    pl.step_new_gpu()
    # Speculative loads only go to GPUs with a free load link: skip the step when there is none.
    if any(n < snapshot.config.max_speculative_loads_per_gpu for n in pl.fleet.loading.values()):
        pl.step_speculative(st.awake)
    if pl.fleet.nodes:
        likely = [m for m, (end, _a) in st.awake.items() if end > now]
        pl.step_stage([*pl.evicted_now, *likely])
    return pl.actions
