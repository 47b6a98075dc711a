"""`prewarm simulate --slo`: prewarm's policy with the cold-start SLO controller steering its speculative
budget, the same pure `prewarm.domain.slo.step` the live scheduler runs each tick, fed the same figures: per
virtual minute, the requests (each one a route lookup) and those that found no ready replica, and the
cold starts completed with their duration bucket (prewarm_cold_start_duration_seconds' buckets)."""

from __future__ import annotations

import math
from collections import deque

from prewarm.domain import slo
from prewarm.domain.policy.types import PolicyConfig
from prewarm.domain.slo import ColdStartSlo
from prewarm.metrics_defs import COLD_START_DURATION

from .engine import Simulation
from .policies import Prewarm


class _Minute:
    __slots__ = ("start", "lookups", "cold", "durations")

    def __init__(self, start: float) -> None:
        self.start = start
        self.lookups = 0
        self.cold = 0
        self.durations: dict[float, int] = {}


class SloPrewarm(Prewarm):
    name = "prewarm"

    def __init__(self, target: ColdStartSlo, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.slo = target
        self.base_share = self.cfg.speculative_share
        self.base_p_prefetch = self.cfg.p_prefetch
        self.st = slo.SloState()
        self.minutes: deque[_Minute] = deque()
        self.steps: list[tuple[float, str, int]] = []  # (time, direction, level)
        self.level_time = [0.0] * (slo.MAX_LEVEL + 1)  # seconds spent at each level
        self._level_since = 0.0
        self._waits_seen = 0

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self._waits_seen = len(sim.waits)

    def _minute(self, t: float) -> _Minute:
        start = t // 60 * 60
        if not self.minutes or self.minutes[-1].start != start:
            self.minutes.append(_Minute(start))
        return self.minutes[-1]

    def on_request(self, t: float, m: int, warm: bool) -> None:
        super().on_request(t, m, warm)
        cur = self._minute(t)
        cur.lookups += 1
        cur.cold += not warm

    def on_tick(self, t: float) -> None:
        waits = self.sim.waits
        if len(waits) > self._waits_seen:  # cold starts completed since the last tick
            cur = self._minute(t)
            for w in waits[self._waits_seen:]:
                if math.isfinite(w):
                    b = COLD_START_DURATION.bucket_of(w)
                    cur.durations[b] = cur.durations.get(b, 0) + 1
            self._waits_seen = len(waits)
        # the live window: the minutes it touches, the first one partly before (slo.window_minutes)
        first = slo.window_minutes(t, self.slo.window_s).start
        while self.minutes and self.minutes[0].start < first:
            self.minutes.popleft()
        durations: dict[float, int] = {}
        for mi in self.minutes:
            for b, n in mi.durations.items():
                durations[b] = durations.get(b, 0) + n
        fig = slo.WindowFigures(sum(mi.lookups for mi in self.minutes), sum(mi.cold for mi in self.minutes),
                                COLD_START_DURATION.quantile_bound(durations, 0.95))
        before = self.st.level
        self.st, decision = slo.step(self.slo, self.st, fig, t, self.base_share)
        if decision is not None:
            self.steps.append((t, decision.direction, decision.level))
            self.level_time[before] += t - self._level_since
            self._level_since = t
            self.cfg = slo.configured(self.cfg, self.base_share, self.st, self.base_p_prefetch)
        super().on_tick(t)

    def report(self, end: float) -> dict:
        times = list(self.level_time)
        times[self.st.level] += max(0.0, end - self._level_since)
        total = sum(times) or 1.0
        return {
            "line": self.slo.describe(),
            "steps_up": sum(1 for _, d, _ in self.steps if d == "up"),
            "steps_down": sum(1 for _, d, _ in self.steps if d == "down"),
            "max_level": max((lv for _, _, lv in self.steps), default=0),
            "mean_speculative_share": sum(slo.share_at(self.base_share, lv) * s for lv, s in enumerate(times)) / total,
            "share_of_time_at_level": [s / total for s in times],
        }
