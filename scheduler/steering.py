"""The live side of the cold-start SLO (PREWARM_COLD_START_SLO): each leader tick reads the window's
route lookup counts from Redis, runs the pure controller (prewarm/domain/slo.py) and hands the policy config
with the speculative budget it gives; a change is an `slo` event with the figures, and the state is kept
in Redis (prewarm.store.slo_state) so the console shows it and a new leader carries on from it.
"""

from __future__ import annotations

import math

import redis

from prewarm import events
from prewarm.domain import slo
from prewarm.domain.policy.types import PolicyConfig
from prewarm.domain.slo import ColdStartSlo
from prewarm.store import lookup_counts, slo_state


class Steering:
    def __init__(self, target: ColdStartSlo, base: PolicyConfig, event_log_max: int = 5000) -> None:
        self.slo = target
        self.base_share = base.speculative_share
        self.base_p_prefetch = base.p_prefetch
        self.event_log_max = event_log_max
        self.state: slo.SloState | None = None  # None: read from Redis at the next tick (a new term)

    def reset(self) -> None:
        self.state = None

    def _resume(self, r: redis.Redis) -> slo.SloState:
        rec = slo_state.read(r) or {}
        same = rec.get("metric") == self.slo.metric and rec.get("target") == self.slo.target
        if not same or not isinstance(rec.get("level"), int):
            return slo.SloState()
        changed = rec.get("changed_at")
        return slo.SloState(level=max(0, min(slo.MAX_LEVEL, rec["level"])),
                            changed_at=float(changed) if changed is not None else -math.inf,
                            under_since=rec.get("under_since"))

    def tick(self, r: redis.Redis, config: PolicyConfig, now: float) -> PolicyConfig:
        """The config this tick plans with; records what changed."""
        if self.state is None:
            self.state = self._resume(r)
        w = lookup_counts.read_window(r, now, self.slo.window_s)
        fig = slo.WindowFigures(w.total(lookup_counts.READY) + w.total(lookup_counts.NOT_READY),
                                w.total(lookup_counts.NOT_READY), w.p95_seconds())
        self.state, decision = slo.step(self.slo, self.state, fig, now, self.base_share)
        share = slo.share_at(self.base_share, self.state.level)
        if decision is not None:
            events.record(r, "slo", "scheduler", reason=decision.reason,
                          numbers={"direction": decision.direction, "metric": self.slo.metric,
                                   "value": decision.value, "target": self.slo.target,
                                   "window_s": self.slo.window_s, "lookups": fig.lookups,
                                   "not_ready": fig.not_ready, "level": decision.level,
                                   "speculative_share": decision.share, "base_share": self.base_share,
                                   "p_prefetch": slo.p_prefetch_at(self.base_p_prefetch, decision.level)},
                          maxlen=self.event_log_max, ts=now)
        slo_state.write(r, {"metric": self.slo.metric, "target": self.slo.target, "window_s": self.slo.window_s,
                            "line": self.slo.describe(), "value": self.state.value, "breached": self.state.breached,
                            "lookups": fig.lookups, "not_ready": fig.not_ready, "level": self.state.level,
                            "max_level": slo.MAX_LEVEL, "speculative_share": share, "base_share": self.base_share,
                            "p_prefetch": slo.p_prefetch_at(self.base_p_prefetch, self.state.level),
                            "changed_at": slo_state.finite(self.state.changed_at),
                            "under_since": self.state.under_since, "at": now})
        return slo.configured(config, self.base_share, self.state, self.base_p_prefetch)
