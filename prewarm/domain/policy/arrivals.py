"""Per-model arrival model derived from the idle-time histogram.

From the histogram of idle times (gaps between requests) blended with a Lomax prior (so that a
model seen once or twice behaves like "probably not soon, maybe never"), we derive, on a grid of
idle times d (time since the model's last request):

- p(d): probability of a request within lead + window after d, given none so far;
- mrl(d): mean residual idle time, E[G - d | G > d] — the expected wait for the next request;
- a timeline of segments labelled "hot" (p >= p_prefetch: worth loading now) and "cold"
  (p < p_release for at least release_min_gap_s: worth releasing).

Idle times beyond the histogram's range follow an exponential tail with mean tail_mean_s.
Pure numpy on a few hundred points per model, many models at once (build_many); cached by the caller
per (histogram version, load time).
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
        # _interp_rows at the grid, the part that does not depend on the rows (the grid lies inside the
        # histogram's span, so no grid point is below the first edge or at the last): worked out once
        n = len(self.edges)
        j = np.searchsorted(self.edges, self.grid, side="right") - 1
        assert j.min() >= 0 and j.max() < n - 1, "the timeline's grid must lie inside the histogram's span"
        lo = self.edges[j]
        self.grid_j, self.grid_j1 = j, j + 1
        self.grid_exact = lo == self.grid
        self.grid_den = self.edges[j + 1] - lo
        self.grid_dx = self.grid - lo


_grid: _Grid | None = None  # one config at a time in practice (the live scheduler's, or a simulation's)


def _grid_for(cfg: PolicyConfig) -> _Grid:
    global _grid
    g = _grid
    if g is None or (g.cfg is not cfg and g.cfg != cfg):
        g = _grid = _Grid(cfg)
    return g


# Models built in one pass of build_many: its 2-D temporaries stay a few MB (each is BATCH × grid points).
BATCH = 256


def build(
    hist: tuple[float, ...] | None, oob: float, load_s: float, cfg: PolicyConfig
) -> ArrivalModel:
    """One model's ArrivalModel (build_many of one)."""
    return build_many([(hist, oob, load_s)], cfg)[0]


def build_many(
    inputs: list[tuple[tuple[float, ...] | None, float, float]], cfg: PolicyConfig
) -> list[ArrivalModel]:
    """The ArrivalModel of each (idle-time histogram or None, out-of-bounds count, load seconds), in
    order. Every model's arrays are rows of 2-D arrays and each step is one numpy call for all of them:
    a starting scheduler builds 10,000 at once, where one by one cost ~30 numpy calls each. Row by row
    the arithmetic is the per-model formulas' (the same operations in the same order; np.interp's
    piecewise-linear rule is `_interp_rows`), so each model comes out bit for bit as built alone."""
    out: list[ArrivalModel] = []
    for i in range(0, len(inputs), BATCH):
        out.extend(_build_rows(inputs[i:i + BATCH], _grid_for(cfg)))
    return out


def _interp_rows(x: np.ndarray, edges: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """np.interp(x[i], edges, ys[i]) for every row i (x: one row for all, or one per row of ys), computed
    as numpy's compiled interp does: below the first edge its value, at or beyond the last the last value,
    at an edge that edge's value, else slope × (x − edge) + value with slope = Δy / Δedge."""
    n = len(edges)
    j = np.searchsorted(edges, x, side="right") - 1  # edges[j] <= x < edges[j + 1]
    at_edge = j >= n - 1
    jc = np.clip(j, 0, n - 2)
    lo = edges[jc]
    exact = at_edge | (lo == x) | (j < 0)
    if x.ndim == 1:
        y0, y1 = ys[:, jc], ys[:, jc + 1]
    else:  # the same gather as np.take_along_axis(ys, jc, axis=1), without its Python-level wrapper
        rows = np.arange(len(ys))[:, None]
        y0, y1 = ys[rows, jc], ys[rows, jc + 1]
    slope = (y1 - y0) / (edges[jc + 1] - lo)
    inside = slope * (x - lo) + y0
    at = np.where(j < 0, ys[:, :1], np.where(at_edge, ys[:, n - 1:], y0))
    return np.where(exact, at, inside)


def _interp_grid(gd: _Grid, ys: np.ndarray) -> np.ndarray:
    """_interp_rows(gd.grid, gd.edges, ys) with its row-free part taken from the grid: the same operations
    on the same numbers, so the same bits."""
    y0 = ys[:, gd.grid_j]
    slope = (ys[:, gd.grid_j1] - y0) / gd.grid_den
    return np.where(gd.grid_exact, y0, slope * gd.grid_dx + y0)


def _build_rows(inputs: list[tuple[tuple[float, ...] | None, float, float]], gd: _Grid) -> list[ArrivalModel]:
    cfg = gd.cfg
    span = gd.span
    edges = gd.edges
    k = len(inputs)
    h = np.zeros((k, cfg.hist_bins))
    oobs = np.zeros(k)
    for r, (hist, oob, _ld) in enumerate(inputs):
        if hist is not None:
            h[r] = hist
        oobs[r] = oob
    n = h.sum(axis=1) + oobs
    w0 = cfg.prior_weight
    pmf = (h + gd.prior_mass) / (n + w0)[:, None]
    tail_mass = (oobs + w0 * gd.prior_oob) / (n + w0)
    # Survival at bin edges; linear inside bins (arrivals uniform within a bin).
    s_edges = np.concatenate([np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1], np.zeros((k, 1))], axis=1) + tail_mass[:, None]
    tail_mean = cfg.tail_mean_s
    grid = gd.grid
    leads = [ld + cfg.tick_s + 5.0 for _h, _o, ld in inputs]  # start loading this long before the window
    lead = np.array(leads)
    s_d = _interp_grid(gd, s_edges)  # surv(grid): the grid lies inside the histogram's span
    x = grid[None, :] + lead[:, None] + cfg.window_s
    inside = _interp_rows(np.minimum(x, span), edges, s_edges)
    beyond = tail_mass[:, None] * np.exp(-np.maximum(x - span, 0.0) / tail_mean)
    s_ahead = np.where(x <= span, inside, beyond)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(s_d > 1e-12, (s_d - s_ahead) / s_d, 0.0)
    # Mean residual life: integral of S from d to infinity over S(d). Trapezoids on the grid
    # (S is piecewise linear, grid_s divides bin_s) plus the exponential tail.
    # surv() at the grid and its end, all inside: np.interp is pointwise, so the grid's part is s_d and the
    # end (the last edge) is the last edge's value
    s_fine = np.concatenate([s_d, s_edges[:, -1:]], axis=1)
    trap = (s_fine[:, :-1] + s_fine[:, 1:]) * 0.5 * cfg.grid_s
    integral = np.cumsum(trap[:, ::-1], axis=1)[:, ::-1] + (tail_mass * tail_mean)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        mrl = np.where(s_d > 1e-12, integral / s_d, INF)
    tails = tail_mass.tolist()
    p_tails = [1.0 - math.exp(-(lead_s + cfg.window_s) / tail_mean) if tm > 1e-12 else 0.0
               for lead_s, tm in zip(leads, tails, strict=True)]

    # Timeline: hot where p >= p_prefetch; cold where p < p_release for release_min_gap_s ahead
    # (the tail beyond the grid counts as an endless run of its own label).
    nk = p.shape[1]
    hot = p >= cfg.p_prefetch
    tail_low = np.array([pt < cfg.p_release for pt in p_tails])
    need = max(1, int(math.ceil(cfg.release_min_gap_s / cfg.grid_s)))
    low = np.concatenate([p < cfg.p_release, np.repeat(tail_low[:, None], need, axis=1)], axis=1).astype(np.int64)
    cs = np.concatenate([np.zeros((k, 1), dtype=np.int64), np.cumsum(low, axis=1)], axis=1)
    cold = (cs[:, need:need + nk] - cs[:, :nk]) >= need
    labels = np.where(hot, 1, np.where(cold, 2, 0))
    rows, cols = np.nonzero(np.diff(labels, axis=1))
    cuts = (cols + 1).tolist()
    cut_labels = labels[rows, cols + 1].tolist()
    first_labels = labels[:, 0].tolist()
    bounds = np.searchsorted(rows, np.arange(k + 1)).tolist()  # model r's cuts: cuts[bounds[r]:bounds[r + 1]]
    names = ("", "hot", "cold")
    p_rows = np.ascontiguousarray(p, dtype=np.float64).tobytes()
    mrl_rows = np.ascontiguousarray(mrl, dtype=np.float64).tobytes()
    row_bytes = nk * 8
    samples = n.tolist()
    g = cfg.grid_s
    out: list[ArrivalModel] = []
    for r in range(k):
        b0, b1 = bounds[r], bounds[r + 1]
        starts = [0, *cuts[b0:b1]]
        ends = [*cuts[b0:b1], nk]
        kinds = [first_labels[r], *cut_labels[b0:b1]]
        segments: list[tuple[float, float, str]] = [
            (float(a * g), float(e * g), names[lab]) for a, e, lab in zip(starts, ends, kinds, strict=True) if lab
        ]
        p_tail = p_tails[r]
        tail_label = "hot" if p_tail >= cfg.p_prefetch else ("cold" if p_tail < cfg.p_release else "")
        if tail_label:
            if segments and segments[-1][2] == tail_label and segments[-1][1] == span:
                segments[-1] = (segments[-1][0], INF, tail_label)
            else:
                segments.append((span, INF, tail_label))
        pa, ma = array("d"), array("d")
        pa.frombytes(p_rows[r * row_bytes:(r + 1) * row_bytes])
        ma.frombytes(mrl_rows[r * row_bytes:(r + 1) * row_bytes])
        out.append(ArrivalModel(
            grid_s=g,
            p=pa,
            mrl=ma,
            p_tail=p_tail,
            mrl_tail=tail_mean if tails[r] > 1e-12 else INF,
            segments=tuple(segments),
            samples=samples[r],
        ))
    return out
