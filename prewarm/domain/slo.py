"""The cold-start SLO controller: from one window's figures to the policy's speculative budget.

Pure (no Redis, no clock of its own): the live scheduler (scheduler/live.py) and the simulator
(`prewarm simulate --slo`) call the same `step` once per tick with the window's counts, so the effect the
simulator measures is the live rule's. It runs beside plan(), not in it: it only moves
PolicyConfig.speculative_share, the share of each GPU that models predicted but not yet requested may hold
and PolicyConfig.p_prefetch, the probability of a request soon above which a model counts as hot and is
loaded ahead of demand (a step lowers it by P_STEP): on the Azure traces the memory share alone binds
nowhere (docs/simulation.md), the threshold is what lets more speculative loads through.

    breach (the window's figure above the line): one step up (+STEP), at most once per SETTLE_SHARE of a
        window (a load takes time to show in the figures), to at most MAX_LEVEL steps above the base;
    back under the line for a whole window: one step down, and another after each further window.
A window with fewer than MIN_LOOKUPS lookups (or no cold start for p95) says nothing: the budget holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from prewarm.domain.policy.types import PolicyConfig


@dataclass(frozen=True)
class ColdStartSlo:
    """The cold-start SLO (PREWARM_COLD_START_SLO, parsed by prewarm.config): the line the scheduler keeps cold starts under by steering its speculative
    budget (below): `share=0.05,window=15m` (share of route lookups not answered ready) or
    `p95=10s` (95th percentile cold-start duration), measured over `window` (default 15m)."""

    metric: str  # "share" | "p95"
    target: float  # a share from 0 to 1, or seconds
    window_s: float = 900.0

    def describe(self) -> str:
        line = f"cold-start share <= {self.target:.1%}" if self.metric == "share" else \
            f"p95 cold start <= {self.target:g} s"
        return f"{line} per {self.window_s / 60:g} min window"


STEP = 0.1  # speculative share added per step
P_STEP = 0.75  # p_prefetch multiplied by this per step
MAX_LEVEL = 3  # steps above the configured share, at most
MAX_SHARE = 0.95  # never the whole GPU: demand loads keep room
MIN_LOOKUPS = 20  # fewer lookups in a window are no measure of a share
SETTLE_SHARE = 0.2  # a step up waits this share of a window after the last change


def minute_of(t: float) -> int:
    """The start of the minute holding t (the per-minute counts' key)."""
    return int(t // 60 * 60)


def window_minutes(now: float, seconds: float) -> range:
    """The minutes a window [now - seconds, now] touches, its first one partly before it: a window is never
    shorter than asked (a 1-minute window read just after a minute turns still holds the minute before).
    The live reads (prewarm.store.lookup_counts, memory_time) and the simulator's SLO window alike."""
    return range(minute_of(now - seconds), minute_of(now) + 1, 60)


@dataclass(frozen=True)
class WindowFigures:
    """One window's route lookups: all counted, those not answered ready, and the cold starts' p95."""

    lookups: int
    not_ready: int
    p95_seconds: float | None = None  # None: no cold start completed in the window

    @property
    def share(self) -> float:
        return self.not_ready / self.lookups if self.lookups else 0.0


@dataclass(frozen=True)
class SloState:
    level: int = 0  # steps above the base share
    changed_at: float = -math.inf
    under_since: float | None = None  # since when the figure has been under the line
    value: float | None = None  # the last window's figure (share or seconds), None: no measure
    breached: bool = False


@dataclass(frozen=True)
class Decision:
    """A change of the budget, with what the `slo` event says."""

    direction: str  # "up" | "down"
    level: int
    share: float
    value: float
    reason: str


def share_at(base: float, level: int) -> float:
    return min(MAX_SHARE, max(base, base + level * STEP))


def p_prefetch_at(base: float, level: int) -> float:
    return base * P_STEP ** max(0, level)


def measure(slo: ColdStartSlo, fig: WindowFigures) -> float | None:
    """The window's figure the line is about, or None when the window says nothing."""
    if slo.metric == "share":
        return fig.share if fig.lookups >= MIN_LOOKUPS else None
    return fig.p95_seconds


def _unit(slo: ColdStartSlo, value: float) -> str:
    return f"{value:.1%}" if slo.metric == "share" else f"{value:.1f} s"


def step(slo: ColdStartSlo, st: SloState, fig: WindowFigures, now: float,
         base_share: float) -> tuple[SloState, Decision | None]:
    """The state after this tick's window, and the change of budget to make (None: it holds)."""
    value = measure(slo, fig)
    if value is None:
        return replace(st, value=None, breached=False), None
    what = "cold-start share" if slo.metric == "share" else "p95 cold start"
    window_min = f"{slo.window_s / 60:g} min"
    if value > slo.target:
        st = replace(st, value=value, breached=True, under_since=None)
        if st.level >= MAX_LEVEL or share_at(base_share, st.level + 1) <= share_at(base_share, st.level):
            return st, None  # at the bound: the event log already says so from the last step
        if now - st.changed_at < SETTLE_SHARE * slo.window_s:
            return st, None
        level = st.level + 1
        share = share_at(base_share, level)
        reason = (f"{what} {_unit(slo, value)} over the last {window_min} is above the SLO line "
                  f"{_unit(slo, slo.target)}: speculative budget raised to {share:.0%} of each GPU, "
                  f"prefetch threshold × {P_STEP ** level:.2f} (step {level} of {MAX_LEVEL})")
        return replace(st, level=level, changed_at=now), Decision("up", level, share, value, reason)
    under = st.under_since if st.under_since is not None else now
    st = replace(st, value=value, breached=False, under_since=under)
    if st.level == 0 or now - under < slo.window_s or now - st.changed_at < slo.window_s:
        return st, None
    level = st.level - 1
    share = share_at(base_share, level)
    reason = (f"{what} {_unit(slo, value)} has stayed under the SLO line {_unit(slo, slo.target)} for "
              f"{window_min}: speculative budget lowered to {share:.0%} of each GPU, prefetch threshold × "
              f"{P_STEP ** level:.2f} (step {level} of {MAX_LEVEL})")
    return replace(st, level=level, changed_at=now, under_since=now), Decision("down", level, share, value, reason)


def configured(config: PolicyConfig, base_share: float, st: SloState, base_p_prefetch: float) -> PolicyConfig:
    """`config` with the speculative share and p_prefetch the state's level gives (the same object when
    unchanged, so the policy's caches keyed on the config survive a tick that changes nothing)."""
    share, p = share_at(base_share, st.level), p_prefetch_at(base_p_prefetch, st.level)
    if config.speculative_share == share and config.p_prefetch == p:
        return config
    return replace(config, speculative_share=share, p_prefetch=p)
