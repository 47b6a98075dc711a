"""Load on demand and evict by recency or age: on-demand-lru, keepalive-10m, seed-pool."""

from __future__ import annotations

from prewarm.domain.action_kinds import DEMAND
from prewarm.domain.states import READY

from .base import Fleet, ReplicaLike, Rule, recency


class OnDemandLRU(Rule):
    """on-demand-lru: load on the first request (a miss), keep the model until memory is needed,
    then evict the least recently used (classic LRU caching; the default of most model servers).
    The conventional rules, with load times: a use is a request's arrival (`base.recency`: also for a
    request that waited for the load; a replica that served none counts from its load start); the
    victim is the ready replica whose last use is oldest (a queued or loading replica holds its memory
    from the moment its load is sent and is never a victim); a request arriving while its model's load
    is queued or loading waits for that load (a cold start, not a miss: no second load); a miss no GPU
    can make room for (its memory held by loads in flight) waits, and is placed again when a load
    completes or another request for it arrives."""

    name = "on-demand-lru"
    monotone_misses = True
    monotone_keys = True

    def _key(self, r: ReplicaLike) -> float:
        return recency(self.fleet, r)

    def on_miss(self, t: float, m: int) -> None:
        self.fleet.place_evicting(m, self._key, kind=DEMAND)


class KeepAlive(OnDemandLRU):
    """keepalive-10m: on-demand LRU plus a fixed keep-alive: a model idle for 10 minutes is
    unloaded (the fixed keep-alive of AWS Lambda / Azure Functions, as described in Shahrad et al.,
    ATC 2020, section 2, and Fuerst & Sharma, ASPLOS 2021). Idle is counted from when the replica last
    served a request (a cold one is served when its load finishes), or from its load start."""

    name = "keepalive-10m"
    keepalive_s = 600.0

    def attach(self, fleet: Fleet) -> None:
        super().attach(fleet)
        self.pending: set[int] = set()

    def _arm(self, t: float, m: int) -> None:
        if m not in self.pending:
            self.pending.add(m)
            self.fleet.timer(t + self.keepalive_s, ("ka", m))

    def on_request(self, t: float, m: int, warm: bool) -> None:
        if warm:
            self._arm(t, m)

    def on_ready(self, t: float, r: ReplicaLike) -> None:
        self._arm(t, r.model)

    def on_timer(self, t: float, payload: tuple) -> None:
        _tag, m = payload
        self.pending.discard(m)
        for gi, r in list(self.fleet.replicas[m].items()):
            if r.state != READY:
                continue
            last = r.last_request if r.last_request is not None else r.since  # idle since it last served
            if t - last >= self.keepalive_s - 1e-9:
                self.fleet.evict(m, gi)
            else:
                self._arm(last, m)


class SeedPool(Rule):
    """seed-pool: the preload pool of prewarm's original design sketch — preload a model the first
    time it is seen (its first request, here: the trace gives nothing earlier), keep a pool under
    the memory cap, and evict the oldest-loaded model (FIFO by load start, not by last use)."""

    name = "seed-pool"
    monotone_misses = True
    monotone_keys = True

    def on_miss(self, t: float, m: int) -> None:
        self.fleet.place_evicting(m, lambda r: r.since, kind=DEMAND)
