"""hybrid-histogram: Shahrad et al., "Serverless in the Wild", USENIX ATC 2020, section 4."""

from __future__ import annotations

import math
from collections import deque

from prewarm.domain.action_kinds import DEMAND, PREWARM
from prewarm.domain.states import READY

from .base import Fleet, ReplicaLike, Rule, recency


class HybridHistogram(Rule):
    """hybrid-histogram: Shahrad et al., "Serverless in the Wild", USENIX ATC 2020, section 4.
    Per function an idle-time histogram (1-minute bins over 4 hours). After each invocation:
    - not representative (fewer than 5 idle times, or coefficient of variation of the bin counts
      below 2) → no pre-warm, keep-alive 4 hours;
    - out-of-bounds idle times (≥ 4 h) are ≥ 50 % of all → predict the next idle time and keep the
      function loaded from 0.85× to 1.15× of it (the paper uses ARIMA; here the documented simpler
      forecaster is the mean of the last 5 idle times);
    - else pre-warm window = 0.9 × 5th percentile ("head" with a 10 % margin), keep-alive =
      1.1 × 99th percentile minus the pre-warm window ("tail" with a 10 % margin): if the pre-warm
      window is non-zero the function is unloaded after the invocation and loaded again when the
      window ends, then kept for the keep-alive; otherwise kept loaded for the keep-alive.
    Load times (the paper's loads are instant): the pre-warm window is when the function must be warm
    again, so its reload starts load_s before the window ends, at t + pre-warm − load_s (t: the
    invocation's arrival). If that start is not after the moment the invocation is served (t for a warm
    one, the end of its load for a cold one) unloading gains nothing and the replica is kept. Either way
    the keep-alive runs from the end of the pre-warm window, to t + pre-warm + keep-alive.
    Memory (the paper's pool never runs out): a load on demand evicts least recently used functions
    when it must (`base.recency`); a pre-warm reload evicts only functions used less recently than the
    call it pre-warms for (the reloaded function is as recent as that call, as it would be had it stayed
    loaded), so it never unloads a function that is in use now to make room for a guess. A reload with
    no such room is not sent; the next call loads on demand."""

    name = "hybrid-histogram"
    bins = 240
    bin_s = 60.0

    def attach(self, fleet: Fleet) -> None:
        super().attach(fleet)
        n = fleet.n_models
        self.hist = [[0] * self.bins for _ in range(n)]
        self.n_in = [0] * n
        self.sumsq = [0] * n  # sum of squared bin counts: the CV without a pass over the bins
        self.oob = [0] * n
        self.last: list[float | None] = [None] * n
        self.recent_idle: list[deque[float]] = [deque(maxlen=5) for _ in range(n)]
        self.gen = [0] * n  # invalidates pre-warm timers of older invocations
        self.unload_at: list[float] = [math.inf] * n
        # one keep-alive timer per model, re-armed lazily: a later end re-arms it when it fires; an earlier
        # end than the pending timer's takes effect only when that one fires (kept longer, never shorter)
        self.unload_pending = [False] * n
        # a cold invocation with a pre-warm window, decided when its load ends: (t, pre-warm, keep-alive, gen)
        self.unserved: list[tuple[float, float, float, int] | None] = [None] * n

    def _key(self, r: ReplicaLike) -> float:
        return recency(self.fleet, r)

    def windows(self, m: int) -> tuple[float, float]:
        """(pre-warm window, keep-alive window) in seconds after the invocation."""
        n_in = self.n_in[m]
        total = n_in + self.oob[m]
        if total < 5:
            return 0.0, 4 * 3600.0
        if self.oob[m] / total >= 0.5:
            pred = sum(self.recent_idle[m]) / len(self.recent_idle[m])
            return 0.85 * pred, 0.3 * pred
        mean = n_in / self.bins
        var = self.sumsq[m] / self.bins - mean * mean
        cv = math.sqrt(max(var, 0.0)) / mean if mean > 0 else 0.0
        if cv < 2.0:
            return 0.0, 4 * 3600.0
        h = self.hist[m]
        head_bin = tail_bin = -1
        cum = 0
        for i, c in enumerate(h):
            cum += c
            if head_bin < 0 and cum >= 0.05 * n_in:
                head_bin = i
            if cum >= 0.99 * n_in:
                tail_bin = i
                break
        head = head_bin * self.bin_s  # lower edge of the 5th-percentile bin
        tail = (tail_bin + 1) * self.bin_s  # upper edge of the 99th-percentile bin
        prewarm = 0.9 * head
        return prewarm, 1.1 * tail - prewarm

    def on_request(self, t: float, m: int, warm: bool) -> None:
        last = self.last[m]
        if last is not None:
            idle = t - last
            b = int(idle // self.bin_s)
            if b < self.bins:
                c = self.hist[m][b]
                self.hist[m][b] = c + 1
                self.n_in[m] += 1
                self.sumsq[m] += 2 * c + 1
            else:
                self.oob[m] += 1
            self.recent_idle[m].append(idle)
        self.last[m] = t
        self.gen[m] += 1
        pw, ka = self.windows(m)
        g = self.gen[m]
        self.unserved[m] = None  # this invocation's windows replace an earlier one's
        if pw <= 0:
            self._keep_until(m, t + ka)
        elif warm:
            self._served(t, m, t, pw, ka, g)
        else:  # served when its load ends: unload or keep is decided then (on_ready)
            self.unserved[m] = (t, pw, ka, g)
            self.unload_at[m] = t + pw + ka

    def _served(self, now: float, m: int, t: float, pw: float, ka: float, g: int) -> None:
        """The invocation that arrived at t, with windows (pw, ka), has been served at `now`: unload until
        its reload's start (pw − load_s after t) if that is later, else keep; kept until t + pw + ka."""
        start = t + pw - self.fleet.load_s[m]
        if start > now:
            for gi, r in list(self.fleet.replicas[m].items()):
                if r.state == READY:
                    self.fleet.evict(m, gi)
            self.fleet.timer(start, ("load", m, g))
        self._keep_until(m, t + pw + ka)

    def _keep_until(self, m: int, until: float) -> None:
        self.unload_at[m] = until
        if not self.unload_pending[m]:
            self.unload_pending[m] = True
            self.fleet.timer(until, ("unload", m))

    def on_ready(self, t: float, r: ReplicaLike) -> None:
        m = r.model
        waited = self.unserved[m]
        if waited is not None:  # the cold invocation is served now
            self.unserved[m] = None
            self._served(t, m, *waited)
        elif t >= self.unload_at[m]:  # its keep-alive ended while it loaded
            self.fleet.evict(m, r.gpu)

    def on_miss(self, t: float, m: int) -> None:
        self.fleet.place_evicting(m, self._key, kind=DEMAND)

    def on_timer(self, t: float, payload: tuple) -> None:
        if payload[0] == "load":
            _tag, m, g = payload
            if g == self.gen[m] and not self.fleet.replicas[m]:
                # LRU with the reloaded model as recent as the call it is for; kept until unload_at (_served)
                call = self.last[m]
                self.fleet.place_evicting(m, self._key, kind=PREWARM,
                                          only_if=lambda r: call is not None and self._key(r) < call)
        else:
            _tag, m = payload
            self.unload_pending[m] = False
            if self.unload_at[m] > t:  # a later invocation extended the keep-alive
                self._keep_until(m, self.unload_at[m])
                return
            for gi, r in list(self.fleet.replicas[m].items()):
                if r.state == READY:
                    self.fleet.evict(m, gi)
