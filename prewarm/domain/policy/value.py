"""The numbers plan() decides by: load and promotion times, and the per-call Values (a model's
expected cold requests if it were absent, the cost of one reload, the order of victims on a GPU,
the requests waiting on each GPU's load link, rates and forecasts)."""

from __future__ import annotations

import math

from prewarm.domain.states import READY

from . import arrivals
from .arrivals import ArrivalModel
from .fleet import Fleet
from .history import STALE_REQUESTS, TrafficHistory, ewma_rate
from .memo import PolicyState, ValueInputs
from .types import GIB, ModelSpec, PolicyConfig, ReplicaState, Snapshot


def load_seconds(spec: ModelSpec, cfg: PolicyConfig) -> float:
    return spec.load_seconds if spec.load_seconds is not None else cfg.default_load_seconds(spec.size_bytes)


def promote_seconds(spec: ModelSpec, cfg: PolicyConfig) -> float:
    """Load time from a node's host cache: measured, else derived; never more than from storage."""
    p = spec.promote_seconds if spec.promote_seconds is not None else cfg.default_promote_seconds(spec.size_bytes)
    return min(p, load_seconds(spec, cfg))


def stale(rate: tuple[float, float, float, float], now: float) -> bool:
    """The long-rate EWMA (ewma_rate's parts), as it stood at its last request, is refuted by the silence since.
    Monotone in `now`: a model refuted stays so until its next request."""
    last = rate[1]
    # the parts spelled out, not *rate: the native build then calls ewma_rate directly, not through Python
    return ewma_rate(rate[0], last, rate[2], rate[3], last) * (now - last) > STALE_REQUESTS


# A quiet replica's kept value counts this much of its loss(): it goes before every replica with
# expected demand, the least valuable quiet one first (soft release, issue 12)
QUIET_WEIGHT = 1e-3


class Values:
    """The numbers one plan() call reads: per model (arrival model, request rate, reload cost,
    expected cold requests if absent), per GPU (the link's waiting requests) and the eviction order
    on each GPU (lowest value per byte first). Memoised for the call; the traffic-derived inputs
    are kept across calls in the PolicyState."""

    def __init__(self, snap: Snapshot, now: float, state: PolicyState) -> None:
        self.s = snap
        self.now = now
        self.cfg = snap.config
        self.st = state
        tr = snap.traffic
        if not isinstance(tr, TrafficHistory):
            raise TypeError(f"plan() reads traffic from a TrafficHistory, got {type(tr).__name__}")
        # typed as the class, not the TrafficView protocol: the native build then calls its methods directly
        self.tr: TrafficHistory = tr
        # the catalog as a dict (a Mapping is copied once): the native build's dict reads are direct calls
        models = snap.models
        self.models: dict[str, ModelSpec] = models if isinstance(models, dict) else dict(models)
        self.fleet = Fleet(snap, now)
        self._loss: dict[str, float] = {}
        self._loading_rate: dict[str, float] = {}
        self._link_rate: float | None = None
        self.grid_s = snap.config.grid_s
        # a stopped stream's rate refuted on this call (PolicyConfig.refute_stale_rate; "auto": by the fleet's record)
        reading = self.cfg.refute_stale_rate
        self.refute = reading == "on" or (reading == "auto" and tr.streams_stop(now))
        # models in a quiet stretch of their timeline (set by plan() once the timeline is brought
        # up to now): their replicas stay resident but are the first victims (QUIET_WEIGHT)
        self.quiet: set[str] = set()
        # GPU -> the overdue model it is held for (steps.hold_for): no other load goes there
        self.held: dict[str, str] = {}
        # demand loads that wait for a busy link (placement.place, PolicyConfig.link_wait), as (model, GPU, seconds
        # until its link frees): the plan wakes at a load's end
        self.link_waits: list[tuple[str, str, float]] = []
        # model -> (P(request within partner_window_s), leader, its start second): partners of a model
        # that just started (set by plan() before anything is valued; partners.py)
        self.expect: dict[str, tuple[float, str, int]] = {}
        # loads in flight per GPU stretch every load: 1 + the mean number already loading
        n = len(self.fleet.gpus)
        self.slowdown = 1.0 + (sum(self.fleet.loading.values()) / n if n else 0.0)
        self.floors = {m for m in state.special if snap.models[m].pinned or snap.models[m].min_replicas > 0} \
            if state.models is snap.models else {m for m, sp in snap.models.items()
                                                        if sp.pinned or sp.min_replicas > 0}

    # ---- per-model numbers ---------------------------------------------------------------
    def _arrival_key(self, model: str) -> tuple[tuple[int, float], tuple[int, tuple[float, ...], float] | None]:
        """What the model's arrival model is built from, as its cache key (stable histogram version, load
        time), and the stable histogram (None before the first idle time)."""
        stable = self.tr.stable_histogram(model)
        return (0 if stable is None else stable[0], load_seconds(self.models[model], self.cfg)), stable

    def arrival(self, model: str) -> ArrivalModel:
        key, stable = self._arrival_key(model)
        hit = self.st.arrival.get(model)
        if hit is not None and hit[0] == key:
            return hit[1]
        am = arrivals.build(None if stable is None else stable[1], 0.0 if stable is None else stable[2],
                            key[1], self.cfg)
        self.st.arrival[model] = (key, am)
        return am

    def prepare_arrivals(self, models: list[str]) -> None:
        """Build, in one arrivals.build_many, the arrival models of `models` that arrival() would build (the
        same models, bit for bit): a starting scheduler needs 10,000 at once."""
        todo: list[tuple[str, tuple[int, float]]] = []
        inputs: list[tuple[tuple[float, ...] | None, float, float]] = []
        for model in models:
            key, stable = self._arrival_key(model)
            hit = self.st.arrival.get(model)
            if hit is None or hit[0] != key:
                todo.append((model, key))
                inputs.append((None if stable is None else stable[1], 0.0 if stable is None else stable[2], key[1]))
        for (model, key), am in zip(todo, arrivals.build_many(inputs, self.cfg), strict=True):
            self.st.arrival[model] = (key, am)

    def request_rate(self, model: str) -> float:
        """Requests/s now: the short-window rate, or the mean per active minute if higher (a model
        that comes in bursts is busy while it is asked for)."""
        return max(self.tr.rate_short(model, self.now), self.tr.stable_requests_per_active_minute(model) / 60.0)

    def cost(self, model: str) -> float:
        """Cold requests one reload costs: the first request plus those arriving during the load,
        which takes the load time stretched by the fleet's current link contention."""
        spec = self.models.get(model)
        if spec is None:
            return 1.0  # dropped from the catalog: nothing will reload it
        rpm = self.tr.stable_requests_per_active_minute(model)
        return 1.0 + max(0.0, rpm - 1.0) * min(self.reload_s(spec) * self.slowdown, 60.0) / 60.0

    def reload_s(self, spec: ModelSpec) -> float:
        """How long the next load of this model takes: from a node's host cache if it is staged."""
        staged = self.fleet.staged_nodes
        if staged and spec.id in staged:
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
        spec = self.models.get(model)
        now = self.now
        e = self.st.value.get(model)
        if e is None or e.spec is not spec or e.cell != int(max(0.0, now - e.anchor) // self.grid_s):
            e = self.value_inputs(model, spec)
            if e is None:  # never requested, or dropped from the catalog
                first = 0.0
                if spec is not None and self.cfg.first_request_value and self.tr.last_arrival(model) is None:
                    # as likely to be asked for as any unrequested model (firsts.py); the link term as below
                    first = self.st.firsts.rate() * (1.0 + self.link_rate() * load_seconds(spec, self.cfg))
                self._loss[model] = first
                return first
        # return rate: the idle-time model's, or the measured recent rate if higher (the
        # histogram's 1-minute bins cannot tell 1 request/s from 1 every 30 s)
        if now >= e.steady_from:
            rate = e.inv_mrl
        else:
            r = e.rate
            rate = ewma_rate(r[0], r[1], r[2], r[3], now)  # spelled out: a direct call natively (stale())
            if rate <= e.inv_mrl or (self.refute and stale(e.rate, now)):
                rate = e.inv_mrl
                e.steady_from = now
        # (an empty dict is not asked: no partners, no host tier, on most calls; loss() runs for every resident)
        x = self.expect.get(model) if self.expect else None
        if x is not None and x[0] / self.cfg.partner_window_s > rate:
            rate = x[0] / self.cfg.partner_window_s  # a partner of a model that just started
        # a reload from host memory is cheaper: a staged model is worth less kept
        staged = self.fleet.staged_nodes
        ld = promote_seconds(e.spec, self.cfg) if staged and model in staged else e.load_s
        # own cold requests during the (stretched) reload, plus the requests its link time
        # would hold up on loads sharing the link then (judged by those waiting now)
        link = self._link_rate if self._link_rate is not None else self.link_rate()
        v = rate * (1.0 + e.extra * min(ld * self.slowdown, 60.0) / 60.0 + link * ld)
        self._loss[model] = v
        return v

    def refuted(self, model: str) -> bool:
        """Its measured rate is refuted by its silence on this call (value.stale; PolicyConfig.refute_stale_rate)."""
        e = self.st.value.get(model)
        return self.refute and e is not None and stale(e.rate, self.now)

    def value_inputs(self, model: str, spec: ModelSpec | None) -> ValueInputs | None:
        got = self.tr.value_inputs(model)
        if got is None or spec is None:
            self.st.value.pop(model, None)
            return None
        last, rate = got
        g = self.grid_s
        anchor = (last // g) * g
        am = self.arrival(model)
        extra = max(0.0, self.tr.stable_requests_per_active_minute(model) - 1.0)
        e = ValueInputs(spec, anchor, int(max(0.0, self.now - anchor) // g),
                   1.0 / max(am.mrl_at(max(0.0, self.now - anchor)), 1.0), extra, rate, load_seconds(spec, self.cfg))
        self.st.value[model] = e
        return e

    # ---- victims and links  -------------------------------------------------------------------
    def evictable(self, r: ReplicaState) -> bool:
        spec = self.models.get(r.model)
        if r.state != READY or r.in_flight > 0 or (r.model, r.gpu) in self.fleet.evicting:
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
            models = self.models
            evicting = f.evicting
            young = self.now - self.cfg.min_residency_s
            of_model = f.of_model
            known = self._loss
            quiet = self.quiet
            for m, r in f.on_gpu[gpu].items():
                # evictable(), inlined: this loop is the policy's hot path
                if r.state != READY or r.in_flight > 0 or r.since > young or (evicting and (m, gpu) in evicting):
                    continue
                spec = models.get(m)
                n = len(of_model.get(m, ()))
                if spec is not None and (spec.pinned or n <= spec.min_replicas):
                    continue
                value = known.get(m)
                if value is None:
                    value = self.loss(m)  # a method call, not a bound-method alias: native-to-native
                if quiet and m in quiet:
                    value *= QUIET_WEIGHT
                v.append((value / max(1, n) / max(r.bytes / GIB, 1e-3), m, r))
            self.sort_victims(self.st.experts.leader if self.cfg.no_regret else "prewarm", v)
            self.fleet.victims[gpu] = v
        return v

    def own_order(self) -> bool:
        """Victims go in prewarm's own order (value per byte) on this call: no other expert of the layer leads."""
        return not self.cfg.no_regret or self.st.experts.leader == "prewarm"

    def sort_victims(self, expert: str, v: list[tuple[float, str, ReplicaState]]) -> None:
        """Sort victim entries in `expert`'s eviction order: prewarm's own, the lowest value per byte first;
        another's (experts.py) after the first victims of every order (quiet, never requested)."""
        if expert == "prewarm":
            v.sort()  # (value, model) is unique on a GPU: the replica is never compared
            return
        self.st.experts.order(expert, self.tr, self.now, self.cfg, v, self.quiet)  # type: ignore[arg-type]

    def yielding(self, gpu: str) -> list[ReplicaState]:
        """The loads in flight on `gpu` that give way to a demand load (PolicyConfig.fill_yields): fills, of
        models never requested and not waited for, a guess a demand load should not share its link with."""
        f = self.fleet
        out: list[ReplicaState] = []
        for m in f.loading_models[gpu]:
            r = f.on_gpu[gpu].get(m)
            if r is not None and (m, gpu) not in f.evicting and self.tr.last_arrival(m) is None \
                    and m not in self.s.waiting:
                out.append(r)
        return out

    def expects_demand(self, model: str) -> bool:
        """False for a model in a quiet stretch of its timeline or never requested: what the
        idle-memory budget counts."""
        return model not in self.quiet and self.tr.last_arrival(model) is not None

    def is_speculative(self, r: ReplicaState) -> bool:
        """Loaded ahead of demand and not asked for since it started loading."""
        if r.last_request is not None and r.last_request >= r.since:
            return False
        a = self.tr.last_arrival(r.model)
        return a is None or a < r.since

    def values_kept(self) -> tuple[float | None, set[str]]:
        """What this call has fixed so far: its link rate (loss() fixes it at its first use) and the models
        it has valued (loss() caches each)."""
        return self._link_rate, set(self._loss)

    def forget_values_since(self, kept: tuple[float | None, set[str]]) -> None:
        """Put the call's values back as `values_kept` gave them: a reader that valued models for its own
        record (the no-regret layer's ghosts) leaves the plan's values as if it had not."""
        self._link_rate, known = kept
        for m in [m for m in self._loss if m not in known]:
            del self._loss[m]

    def link_rate(self, keep: bool = True) -> float:
        """Requests per second waiting on loads, per GPU link: what one link-second holds up. Kept for the
        call from its first use (loss() values every model by the same figure); `keep=False`: read it
        without fixing it (a reader that must not change what loss() later sees)."""
        if self._link_rate is not None:
            return self._link_rate
        n = len(self.fleet.gpus)
        v = sum(self.loading_rate(g, keep) for g in sorted(self.fleet.gpus)) / n if n else 0.0
        if keep:
            self._link_rate = v
        return v

    def loading_rate(self, gpu: str, keep: bool = True) -> float:
        """Sum of request rates of the models loading on a GPU (their requests wait on the link). Kept for
        the call (do_preload adds each new load to it); `keep=False`: read it without keeping it."""
        v = self._loading_rate.get(gpu)
        if v is None:
            v = sum(max(self.tr.rate_short(m, self.now), 1e-3) for m in self.fleet.loading_models[gpu])
            if keep:
                self._loading_rate[gpu] = v
        return v

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

