"""Per-model arrival model derived from the idle-time histogram.

From the histogram of idle times (gaps between requests) blended with a Lomax prior (so that a
model seen once or twice behaves like "probably not soon, maybe never"), we derive, on a grid of
idle times d (time since the model's last request):

- p(d): probability of a request within lead + window after d, given none so far;
- mrl(d): mean residual idle time, E[G - d | G > d] — the expected wait for the next request;
- a timeline of segments labelled "hot" (p >= p_prefetch: worth loading now) and "cold"
  (p < p_release for at least release_min_gap_s: worth releasing).

Idle times beyond the histogram's range follow an exponential tail with mean tail_mean_s.
Pure numpy on a few hundred points; cached by the caller per (histogram version, load time).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from .types import PolicyConfig

INF = math.inf


@dataclass(frozen=True, slots=True)
class ArrivalModel:
    grid_s: float
    # at d = k * grid_s; flat arrays of doubles, not tuples of float objects (cheaper to make and free)
    p: array[float]
    mrl: array[float]
    p_tail: float  # beyond the grid
    mrl_tail: float
    segments: tuple[tuple[float, float, str], ...]  # (start idle, end idle, "hot" | "cold")
    samples: float  # idle times observed (after halving)

    def index(self, idle: float) -> int:
        return int(idle // self.grid_s) if idle >= 0 else 0

    def p_at(self, idle: float) -> float:
        k = self.index(idle)
        return self.p[k] if k < len(self.p) else self.p_tail

    def mrl_at(self, idle: float) -> float:
        k = self.index(idle)
        return self.mrl[k] if k < len(self.mrl) else self.mrl_tail

    def segment_at(self, idle: float) -> str | None:
        for start, end, label in self.segments:
            if start <= idle < end:
                return label
        return None


def _doubles(x: np.ndarray) -> array[float]:
    out = array("d")
    out.frombytes(np.ascontiguousarray(x, dtype=np.float64).tobytes())
    return out


def _lomax_survival(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return (beta / (x + beta)) ** alpha


class _Grid:
    """What build() derives from the config alone (the same arrays for every model)."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg
        self.span = cfg.hist_bins * cfg.hist_bin_s
        self.edges = np.arange(cfg.hist_bins + 1, dtype=float) * cfg.hist_bin_s
        prior_s = _lomax_survival(self.edges, cfg.prior_alpha, cfg.prior_beta_s)
        self.prior_mass = cfg.prior_weight * (prior_s[:-1] - prior_s[1:])
        self.prior_oob = float(prior_s[-1])
        self.grid = np.arange(0.0, self.span, cfg.grid_s)
        self.grid_closed = np.append(self.grid, self.span)  # the grid and its right end


_grid: _Grid | None = None  # one config at a time in practice (the live scheduler's, or a simulation's)


def _grid_for(cfg: PolicyConfig) -> _Grid:
    global _grid
    g = _grid
    if g is None or (g.cfg is not cfg and g.cfg != cfg):
        g = _grid = _Grid(cfg)
    return g


def build(
    hist: tuple[float, ...] | None, oob: float, load_s: float, cfg: PolicyConfig
) -> ArrivalModel:
    gd = _grid_for(cfg)
    span = gd.span
    edges = gd.edges
    h = np.zeros(cfg.hist_bins) if hist is None else np.asarray(hist, dtype=float)
    n = float(h.sum() + oob)
    w0 = cfg.prior_weight
    pmf = (h + gd.prior_mass) / (n + w0)
    tail_mass = (oob + w0 * gd.prior_oob) / (n + w0)
    # Survival at bin edges; linear inside bins (arrivals uniform within a bin).
    s_edges = np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]]) + tail_mass
    tail_mean = cfg.tail_mean_s

    def surv(x: np.ndarray) -> np.ndarray:
        inside = np.interp(np.minimum(x, span), edges, s_edges)
        beyond = tail_mass * np.exp(-np.maximum(x - span, 0.0) / tail_mean)
        return np.where(x <= span, inside, beyond)

    grid = gd.grid
    lead = load_s + cfg.tick_s + 5.0  # start loading this long before the window
    s_d = np.interp(grid, edges, s_edges)  # surv(grid): the grid lies inside the histogram's span
    s_ahead = surv(grid + lead + cfg.window_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(s_d > 1e-12, (s_d - s_ahead) / s_d, 0.0)
    # Mean residual life: integral of S from d to infinity over S(d). Trapezoids on the grid
    # (S is piecewise linear, grid_s divides bin_s) plus the exponential tail.
    s_fine = np.interp(gd.grid_closed, edges, s_edges)  # surv() at the grid and its end, all inside
    trap = (s_fine[:-1] + s_fine[1:]) * 0.5 * cfg.grid_s
    integral = np.cumsum(trap[::-1])[::-1] + tail_mass * tail_mean
    with np.errstate(divide="ignore", invalid="ignore"):
        mrl = np.where(s_d > 1e-12, integral / s_d, INF)
    p_tail = 1.0 - math.exp(-(lead + cfg.window_s) / tail_mean) if tail_mass > 1e-12 else 0.0

    # Timeline: hot where p >= p_prefetch; cold where p < p_release for release_min_gap_s ahead
    # (the tail beyond the grid counts as an endless run of its own label).
    hot = p >= cfg.p_prefetch
    tail_low = p_tail < cfg.p_release
    need = max(1, int(math.ceil(cfg.release_min_gap_s / cfg.grid_s)))
    low = np.concatenate([p < cfg.p_release, np.full(need, tail_low)]).astype(np.int64)
    cs = np.concatenate([[0], np.cumsum(low)])
    nk = len(p)
    cold = (cs[need:need + nk] - cs[:nk]) >= need
    labels = np.where(hot, 1, np.where(cold, 2, 0))
    cuts = np.flatnonzero(np.diff(labels)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [nk]])
    names = {1: "hot", 2: "cold"}
    segments: list[tuple[float, float, str]] = [
        (float(a * cfg.grid_s), float(b * cfg.grid_s), names[int(labels[a])])
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True) if labels[a]
    ]
    tail_label = "hot" if p_tail >= cfg.p_prefetch else ("cold" if tail_low else "")
    if tail_label:
        if segments and segments[-1][2] == tail_label and segments[-1][1] == span:
            segments[-1] = (segments[-1][0], INF, tail_label)
        else:
            segments.append((span, INF, tail_label))
    mrl_tail = tail_mean if tail_mass > 1e-12 else INF
    return ArrivalModel(
        grid_s=cfg.grid_s,
        p=_doubles(p),
        mrl=_doubles(mrl),
        p_tail=p_tail,
        mrl_tail=mrl_tail,
        segments=tuple(segments),
        samples=n,
    )
