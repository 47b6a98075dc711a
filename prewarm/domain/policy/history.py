"""TrafficHistory: a pure, deterministic, incremental per-model traffic accumulator.

The live scheduler feeds it per-second request counts read from Redis (`add_bucket`); the
simulator feeds it the trace (`add`). Everything is quantised to whole seconds, so feeding one
request at a time or one count per second gives the same state. Memory per model is bounded:
a handful of numbers plus an idle-time histogram of `bins` floats (two copies).

Kept per model:
- last arrival (second), total requests and active minutes (mean requests per active minute);
- exponentially weighted rates over a short and a long window (time constants in seconds);
- the idle-time histogram of Shahrad et al. (ATC 2020): gaps between consecutive seconds with
  requests, in `bin_s` bins over `bins × bin_s`, plus an out-of-bounds count. Counts are halved
  when they pass `halve_at` so that old patterns fade. A "stable" copy of the histogram is taken
  at refresh points fixed by the number of gaps seen (every gap up to 16, then every ~12 %), so
  that what the policy derives from it can be cached by version and still be a pure function of
  the traffic fed in.

Kept for the fleet: the record of silences that refuted a model's measured rate, and whether they were stops or
pauses (silences.py; PolicyConfig.refute_stale_rate's "auto").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeVar

from .silences import Silences

K = TypeVar("K")
V = TypeVar("V")


def _refresh_points() -> set[int]:
    pts = set(range(1, 17))
    x = 16.0
    while x < 1e9:
        x = float(math.ceil(x * 1.125))
        pts.add(int(x))
    return pts


_REFRESH = frozenset(_refresh_points())
_EMPTY: dict[str, int] = {}


class _ModelTraffic:
    __slots__ = (
        "first_second", "last_second", "total", "active_minutes", "last_minute",
        "fed", "rate_p", "rate_s", "rate_l", "rate_t",
        "hist", "oob", "gaps_seen", "weight",
        "stable_version", "stable_hist", "stable_oob", "stable_rpm", "starts",
    )

    def __init__(self, bins: int) -> None:
        self.last_second: int | None = None
        self.first_second = 0
        self.total = 0.0  # halved with the histogram (requests per active minute is a recent figure)
        self.fed = 0.0  # every request fed, never halved: what a record following the stream counts
        self.active_minutes = 0.0
        self.last_minute = -1
        self.rate_p = 0.0
        self.rate_s = 0.0
        self.rate_l = 0.0
        self.rate_t = 0.0
        self.hist = [0.0] * bins
        self.oob = 0.0
        self.gaps_seen = 0  # monotonic, never halved: drives refresh points
        self.weight = 0.0  # current (halved) number of gaps in hist + oob
        self.stable_version = 0
        self.stable_hist: tuple[float, ...] = ()
        self.stable_oob = 0.0
        self.stable_rpm = 0.0
        self.starts = 0  # requests after start_gap_s or more of idle time (the first request included)


class TrafficHistory:
    """Per-model traffic accumulator. See the module docstring."""

    def __init__(
        self,
        bin_s: float = 60.0,
        bins: int = 240,
        short_window_s: float = 60.0,
        long_window_s: float = 600.0,
        halve_at: float = 2048.0,
        panic_window_s: float = 10.0,
        start_gap_s: float = 300.0,
        partner_window_s: float = 60.0,
        partner_max_group: int = 128,
        partner_table: int = 128,
    ) -> None:
        self.panic_window_s = panic_window_s
        self.bin_s = bin_s
        self.bins = bins
        self.short_window_s = short_window_s
        self.long_window_s = long_window_s
        self.halve_at = halve_at
        self._m: dict[str, _ModelTraffic] = {}
        self._seq = 0
        # model -> seq of its last change, kept in order of last change (re-inserted on change)
        self._changed: dict[str, int] = {}
        self._decay_dt = 0.0  # _decay's last dt and its factors
        self._decay_of = (1.0, 1.0, 1.0)
        self.start_gap_s = start_gap_s
        self.partner_window_s = partner_window_s
        self.partner_max_group = partner_max_group
        self.partner_table = partner_table
        # co-starts (partners.py): model -> the second of its last start, kept while a later start could
        # still be within partner_window_s of it (in time order); and model -> partner -> starts within
        # that window
        self._recent_starts: dict[str, int] = {}
        self._newest_start = -(1 << 62)
        self._co: dict[str, dict[str, int]] = {}
        self._co_version: dict[str, int] = {}  # model -> changes of its co-start table (a reader's memo key)
        self._unpaired: list[tuple[int, str]] = []  # (second, model) of starts not yet paired
        self.silences = Silences()
        self._judging = True  # feeds go to the record of silences (add_series' `judge`)

    @classmethod
    def for_config(cls, cfg: object) -> TrafficHistory:
        """A history whose windows and bins match a PolicyConfig."""
        return cls(
            bin_s=cfg.hist_bin_s,  # type: ignore[attr-defined]
            bins=cfg.hist_bins,  # type: ignore[attr-defined]
            short_window_s=cfg.short_window_s,  # type: ignore[attr-defined]
            panic_window_s=cfg.panic_window_s,  # type: ignore[attr-defined]
            long_window_s=cfg.long_window_s,  # type: ignore[attr-defined]
            start_gap_s=cfg.partner_gap_s,  # type: ignore[attr-defined]
            partner_window_s=cfg.partner_window_s,  # type: ignore[attr-defined]
            partner_max_group=cfg.partner_max_group,  # type: ignore[attr-defined]
            partner_table=cfg.partner_table,  # type: ignore[attr-defined]
        )

    # ---- feeding -------------------------------------------------------------------------
    def add(self, model: str, t: float, count: int = 1) -> None:
        """Record `count` requests for `model` at time `t` (quantised to its second)."""
        self.add_bucket(model, math.floor(t), count)

    def add_bucket(self, model: str, second: int, count: int) -> None:
        """Record the request count of one one-second bucket. Buckets may come in any order;
        a late bucket (older than the last one seen) updates counts and rates, not gaps."""
        if count <= 0:
            return
        m = self._m.get(model)
        if m is None:
            m = self._m[model] = _ModelTraffic(self.bins)
        self._feed(model, m, second, count)
        self._seq += 1
        self._changed.pop(model, None)
        self._changed[model] = self._seq

    def add_series(self, model: str, buckets: list[tuple[int, int]], shift: int = 0, judge: bool = True) -> None:
        """add_bucket(model, second + shift, count) for each (second, count) in order, in one call (the same
        state after it): a starting scheduler feeds ~200,000 per-minute counts. `judge`: False where the buckets are
        coarser than the traffic (a minute's count at one second makes each busy minute a silence that refutes the
        rate and ends: pauses the traffic never had), so the record of silences (silences.py) is left as it was."""
        m = self._m.get(model)
        fed = 0
        self._judging = judge
        try:
            for second, count in buckets:
                if count <= 0:
                    continue
                if m is None:
                    m = self._m[model] = _ModelTraffic(self.bins)
                self._feed(model, m, second + shift, count)
                fed += 1
        finally:
            self._judging = True
        if fed:
            self._seq += fed
            self._changed.pop(model, None)
            self._changed[model] = self._seq

    def _decay(self, dt: float) -> tuple[float, float, float]:
        """exp(-dt / tau) of the panic, short and long windows; the last dt's are kept (a warm-up's buckets
        are a minute apart: one dt, computed once)."""
        if dt != self._decay_dt:
            self._decay_dt = dt
            self._decay_of = (math.exp(-dt / self.panic_window_s), math.exp(-dt / self.short_window_s),
                              math.exp(-dt / self.long_window_s))
        return self._decay_of

    def _refuting(self, m: _ModelTraffic) -> float | None:
        """The silence after m's last request that refutes its long rate then (value.stale); None where its EWMA
        was fed for less than its time constant (a first request's rate is a guess)."""
        last = m.last_second
        if last is None or last - m.first_second + 1 < self.long_window_s:
            return None
        r = ewma_rate(m.rate_l, m.rate_t, float(m.first_second), self.long_window_s, float(last))
        return STALE_REQUESTS / r if r > 0.0 else None

    def silence(self, model: str) -> tuple[int, float] | None:
        """(last request, the silence that refutes its rate), where its silence counts (Silences)."""
        m = self._m.get(model)
        if m is None or m.last_second is None:
            return None
        s0 = self._refuting(m)
        return None if s0 is None else (m.last_second, s0)

    def streams_stop(self, now: float) -> bool:
        """This fleet's refuted silences have more often been stops than pauses lately (silences.py)."""
        return self.silences.stop(now, self.silence)

    def _feed(self, model: str, m: _ModelTraffic, second: int, count: int) -> None:
        if self._judging and m.last_second is not None and second > m.last_second:
            s0 = self._refuting(m)  # judged by the rate at the last request, before this bucket moves it
            if s0 is not None:
                self.silences.ended(model, m.last_second, second, s0)
        # Rates: decay both to this second, then add the bucket (rate unit: requests/s).
        if second >= m.rate_t:
            dt = second - m.rate_t
            if dt:
                dp, ds, dl = self._decay(dt)
                m.rate_p *= dp
                m.rate_s *= ds
                m.rate_l *= dl
                m.rate_t = float(second)
            m.rate_p += count / self.panic_window_s
            m.rate_s += count / self.short_window_s
            m.rate_l += count / self.long_window_s
        else:
            dt = m.rate_t - second
            m.rate_p += count / self.panic_window_s * math.exp(-dt / self.panic_window_s)
            m.rate_s += count / self.short_window_s * math.exp(-dt / self.short_window_s)
            m.rate_l += count / self.long_window_s * math.exp(-dt / self.long_window_s)
        m.total += count
        m.fed += count
        minute = second // 60
        if minute > m.last_minute:
            m.active_minutes += 1
            m.last_minute = minute
        last = m.last_second
        if last is None:
            m.last_second = second
            m.first_second = second
            self._start(model, m, second)
        elif second > last:
            gap = second - last
            if gap >= self.start_gap_s:
                self._start(model, m, second)
            b = int(gap // self.bin_s)
            if b < self.bins:
                m.hist[b] += 1.0
            else:
                m.oob += 1.0
            m.weight += 1.0
            m.gaps_seen += 1
            m.last_second = second
            if self._judging and second - m.first_second + 1 >= self.long_window_s:
                self.silences.watch(model, second)
            if m.weight > self.halve_at:  # let old patterns fade; keeps proportions
                m.hist = [h * 0.5 for h in m.hist]
                m.oob *= 0.5
                m.weight *= 0.5
                m.total *= 0.5
                m.active_minutes *= 0.5
            if m.gaps_seen in _REFRESH:
                m.stable_hist = tuple(m.hist)
                m.stable_oob = m.oob
                m.stable_rpm = m.total / m.active_minutes if m.active_minutes else 0.0
                m.stable_version += 1

    def _start(self, model: str, m: _ModelTraffic, second: int) -> None:
        """A start of `model`: counted now, paired with other models' starts when next read (_pair), in
        time order, so that feeding model by model (a warm-up's series) pairs as feeding in time does."""
        m.starts += 1
        self._unpaired.append((second, model))

    def _pair(self) -> None:
        """Count a co-start of each unpaired start with every other model whose last start is within
        partner_window_s of it. The unpaired are paired in time order, and each read's starts are later
        than the last read's (the live feed reads the seconds since its last read), so `recent` stays in
        time order: once what is older than the window is dropped, every start left pairs with the new
        one, at no cost per pair when they are a mass start. A start earlier than one already paired is
        paired by a scan from the newest end."""
        w = self.partner_window_s
        recent = self._recent_starts
        co = self._co
        cap = self.partner_max_group
        table = self.partner_table
        self._unpaired.sort()
        for second, model in self._unpaired:
            recent.pop(model, None)
            if second > self._newest_start:
                self._newest_start = second
                horizon = second - w
                stale = []
                for other, s in recent.items():  # oldest first: what no later start can pair with
                    if s >= horizon:
                        break
                    stale.append(other)
                for other in stale:
                    del recent[other]
            near: list[str] = []
            if second == self._newest_start:  # in time order: every start left is within the window
                if not cap or len(recent) <= cap:
                    near = list(recent)
            else:  # an earlier second than one paired before (not the feeds' order): scan from the newest
                for other, s in reversed(recent.items()):
                    if s < second - w:
                        break
                    if s <= second + w:
                        near.append(other)
                        if cap and len(near) > cap:
                            near = []
                            break
            # more than `cap` others (a timer every model shares, a restart): a mass start, no pair is a sign
            if near:
                mine = co.get(model)
                if mine is None:
                    mine = co[model] = {}
                version = self._co_version
                version[model] = version.get(model, 0) + 1
                for other in near:
                    _count(mine, other, table)
                    theirs = co.get(other)
                    if theirs is None:
                        theirs = co[other] = {}
                    _count(theirs, model, table)
                    version[other] = version.get(other, 0) + 1
            recent[model] = second
        self._unpaired = []

    # ---- reading (TrafficView) -----------------------------------------------------------
    @property
    def seq(self) -> int:
        """A counter that grows with every change."""
        return self._seq

    def changed_since(self, seq: int) -> list[str] | None:
        """Models changed after `seq`, most recent first."""
        out: list[str] = []
        for model in reversed(self._changed):
            if self._changed[model] <= seq:
                break
            out.append(model)
        return out

    def models(self) -> list[str]:
        return list(self._m)

    def last_arrival(self, model: str) -> float | None:
        m = self._m.get(model)
        return None if m is None or m.last_second is None else float(m.last_second)

    def _rate(self, m: _ModelTraffic, raw: float, tau: float, now: float) -> float:
        return ewma_rate(raw, m.rate_t, float(m.first_second), tau, now)

    def rate_panic(self, model: str, now: float) -> float:
        """Requests/s over panic_window_s (Knative's panic window: a tenth of the short one)."""
        m = self._m.get(model)
        return 0.0 if m is None else self._rate(m, m.rate_p, self.panic_window_s, now)

    def rate_short(self, model: str, now: float) -> float:
        """Requests/s, exponentially weighted over short_window_s."""
        m = self._m.get(model)
        return 0.0 if m is None else self._rate(m, m.rate_s, self.short_window_s, now)

    def rate_long(self, model: str, now: float) -> float:
        """Requests/s, exponentially weighted over long_window_s."""
        m = self._m.get(model)
        return 0.0 if m is None else self._rate(m, m.rate_l, self.long_window_s, now)

    def lag(self, model: str, now: float, tau: float) -> float:
        """How far back in time an EWMA of time constant tau is centred, given the data span."""
        m = self._m.get(model)
        floor = min(10.0, tau)
        span = floor if m is None else max(floor, now - m.first_second + 1.0)
        e = math.exp(-span / tau)
        return tau - span * e / (1.0 - e)

    def total(self, model: str) -> float:
        """Requests fed for the model so far (the no-regret layer and the loads-ahead record count the new
        ones): never halved, unlike the count behind requests_per_active_minute, which is."""
        m = self._m.get(model)
        return 0.0 if m is None else m.fed

    def requests_per_active_minute(self, model: str) -> float:
        m = self._m.get(model)
        if m is None or m.active_minutes <= 0:
            return 0.0
        return m.total / m.active_minutes

    def stable_requests_per_active_minute(self, model: str) -> float:
        """requests_per_active_minute as of the last refresh point (or now, before the first)."""
        m = self._m.get(model)
        if m is None:
            return 0.0
        if m.stable_version == 0:
            return self.requests_per_active_minute(model)
        return m.stable_rpm

    def value_inputs(self, model: str) -> tuple[float, tuple[float, float, float, float]] | None:
        """(last arrival, (rate_l, rate_t, first second, long_window_s)), or None before the first
        request: what the policy's value function reads. They change only when the model does
        (changed_since), and ewma_rate(*parts, now) is its long rate at any `now`."""
        m = self._m.get(model)
        if m is None or m.last_second is None:
            return None
        return float(m.last_second), (m.rate_l, m.rate_t, float(m.first_second), self.long_window_s)

    def starts(self, model: str) -> int:
        """How many times the model started: its first request, and each after start_gap_s idle."""
        m = self._m.get(model)
        return 0 if m is None else m.starts

    def recent_starts(self) -> dict[str, int]:
        """Model -> the second of its last start, for starts recent enough to pair with a new one
        (read-only for callers)."""
        if self._unpaired:
            self._pair()
        return self._recent_starts

    def co_starts(self, model: str) -> dict[str, int]:
        """Partner -> how many of the model's starts it started within partner_window_s of (read-only)."""
        if self._unpaired:
            self._pair()
        return self._co.get(model) or _EMPTY

    def co_version(self, model: str) -> int:
        """Grows each time the model's co_starts table changes (read after co_starts or recent_starts)."""
        if self._unpaired:
            self._pair()
        return self._co_version.get(model, 0)

    def stable_version(self, model: str) -> int:
        """Grows each time the stable histogram is refreshed; 0 before the first idle time."""
        m = self._m.get(model)
        return 0 if m is None else m.stable_version

    def stable_histogram(self, model: str) -> tuple[int, tuple[float, ...], float] | None:
        """(version, idle-time bin counts, out-of-bounds count) as of the last refresh point,
        or None before the first idle time was seen."""
        m = self._m.get(model)
        if m is None or m.stable_version == 0:
            return None
        return m.stable_version, m.stable_hist, m.stable_oob


def made_before(entries: Mapping[K, V], when: Callable[[V], float], horizon: float) -> list[K]:
    """The keys of `entries` made before `horizon`, for a record kept in the order its entries were made (a
    dict, oldest first: the duels and bets of the no-regret layer and the loads-ahead record): the walk stops
    at the first newer entry, so expiring costs what expires, not the whole record."""
    old: list[K] = []
    for k, v in entries.items():
        if when(v) >= horizon:
            break
        old.append(k)
    return old


def new_requests(tr: TrafficHistory, seq: int, seen: dict[str, float],
                 keep: Callable[[str], bool] | None = None) -> list[tuple[float, str, float]]:
    """The requests fed to `tr` since `seq` (-1: all), as (the model's last arrival, model, how many), in
    time order: what a record that follows the stream (the no-regret layer's ghosts, the loads-ahead
    record) takes at each plan() call. `seen` (model -> requests taken so far) is brought up to date for
    the models `keep` accepts (all when None); the others are skipped and stay unseen."""
    changed = tr.models() if seq < 0 else tr.changed_since(seq)
    out: list[tuple[float, str, float]] = []
    for m in changed or ():
        if keep is not None and not keep(m):
            continue
        total = tr.total(m)
        n = total - seen.get(m, 0.0)
        if n <= 0:
            continue
        seen[m] = total
        t = tr.last_arrival(m)
        if t is not None:
            out.append((t, m, n))
    out.sort()
    return out


def _count(table: dict[str, int], partner: str, size: int) -> None:
    """One more co-start with `partner`. A full table (`size` entries; 0: unbounded) makes room by
    dropping its oldest partner seen only once: a real partner comes back before many others do."""
    c = table.get(partner)
    if c is not None:
        table[partner] = c + 1
        return
    if size and len(table) >= size:
        drop = None
        for other, n in table.items():
            if n < 2:
                drop = other
                break
        if drop is None:
            return  # every entry has come back: a newcomer waits until one of them is a singleton
        del table[drop]
    table[partner] = 1


# value.stale: a Poisson stream at the measured rate leaves a silence this many requests long with probability
# e^-4.6 = 1 %
STALE_REQUESTS = 4.6


def ewma_rate(raw: float, rate_t: float, first: float, tau: float, now: float) -> float:
    """An EWMA of time constant tau (last updated at rate_t, fed since `first`) read at `now`, in
    requests/s. Bias-corrected like Adam's moments: an EWMA started from zero S seconds ago is low by
    (1 - e^(-S/tau)); S is at least 10 s so one request is not read as a burst. Never grows with
    `now` (decay and correction both shrink it), which lets callers cache a bound."""
    span = now - first + 1.0
    # 1 - e^-40 rounds to 1.0 in a double: skip the exp for models older than 40 windows
    bias = 1.0 - math.exp(-max(min(10.0, tau), span) / tau) if span < 40.0 * tau else 1.0
    dt = now - rate_t
    rate = raw * math.exp(-dt / tau) if dt > 0.0 else raw
    return rate / bias
