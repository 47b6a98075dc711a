"""Per-model arrival model derived from the idle-time histogram.

From the histogram of idle times (gaps between requests) blended with a Lomax prior (so that a
model seen once or twice behaves like "probably not soon, maybe never"), we derive, on a grid of
idle times d (time since the model's last request):

- p(d): probability of a request within lead + window after d, given none so far;
- mrl(d): mean residual idle time, E[G - d | G > d] — the expected wait for the next request;
- a timeline of segments labelled "hot" (p >= p_prefetch: worth loading now) and "cold"
  (p < p_release for at least release_min_gap_s: worth releasing).

Idle times beyond the histogram's range follow an exponential tail with mean tail_mean_s, whose rate is
itself uncertain (a Gamma prior of the prior's shape, updated by the idle times seen past the range): past the range
the mean residual life grows with the silence (`_slope`), so of two models silent for hours the longer silent is
worth less kept. With a memoryless tail, every model silent past the range was worth the same per request, and its
size alone ordered them as victims: on sparse traffic the victims that came back cold had been idle 6 h where LRU's
had been idle 18 h, and prewarm evicted twice as often (docs/simulation.md, "Silence is evidence").
Pure numpy on a few hundred points per model, many models at once (build_many); cached by the caller
per (histogram version, load time).
"""

from __future__ import annotations

import math
import struct
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
    # beyond the grid the mean residual life grows with the silence: mrl_tail + (idle - tail_from) * tail_slope
    tail_from: float = INF
    tail_slope: float = 0.0

    def index(self, idle: float) -> int:
        return int(idle // self.grid_s) if idle >= 0 else 0

    def p_at(self, idle: float) -> float:
        k = self.index(idle)
        return self.p[k] if k < len(self.p) else self.p_tail

    def mrl_at(self, idle: float) -> float:
        k = self.index(idle)
        if k < len(self.mrl):
            return self.mrl[k]
        return self.mrl_tail + max(0.0, idle - self.tail_from) * self.tail_slope

    def segment_at(self, idle: float) -> str | None:
        for start, end, label in self.segments:
            if start <= idle < end:
                return label
        return None


def _slope(cfg: PolicyConfig, oob: float) -> float:
    """How fast the mean residual life grows with the silence past the histogram's span: 1 / (a + k - 1), the
    posterior of the tail's unknown rate (Gamma, shape a = the prior's alpha, its mean excess tail_mean_s) after k
    idle times seen past the span (`oob`, each taken at that mean). Silence is evidence: after an excess e the
    posterior mean wait is tail_mean_s + e / (a + k - 1) (the Lomax's mean residual life where k = 0); a model
    seen often to come back after long gaps has a tail it knows, and waits little longer for them."""
    shape = cfg.prior_alpha - 1.0 + oob
    return 1.0 / shape if shape > 0.0 else 0.0


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
        j, at_edge, _jc, lo, exact = _interp_points(self.grid, self.edges)
        assert j.min() >= 0 and not at_edge.any(), "the timeline's grid must lie inside the histogram's span"
        self.grid_j, self.grid_j1 = j, j + 1
        self.grid_exact = exact
        self.grid_den = self.edges[j + 1] - lo
        self.grid_dx = self.grid - lo
        # the same numbers as Python floats, for the one-model path (_build_one)
        self.prior_mass_l: list[float] = self.prior_mass.tolist()
        self.grid_j_l: list[int] = j.tolist()
        self.grid_exact_l: list[bool] = self.grid_exact.tolist()
        self.grid_den_l: list[float] = self.grid_den.tolist()
        self.grid_dx_l: list[float] = self.grid_dx.tolist()
        self.need = max(1, int(math.ceil(cfg.release_min_gap_s / cfg.grid_s)))
        self.row = struct.Struct(f"{len(self.grid)}d")  # a row of doubles: array("d", list) parses each
        self.ahead: dict[float, _Ahead] = {}  # load seconds -> where the grid + lead + window falls

    def ahead_for(self, load_s: float) -> _Ahead:
        hit = self.ahead.get(load_s)
        if hit is None:
            if len(self.ahead) >= AHEAD_CACHE:
                self.ahead.clear()  # a catalog's load times are few; a bound, not an eviction policy
            hit = self.ahead[load_s] = _Ahead(self, load_s)
        return hit


# load times whose _Ahead is kept (each a few hundred numbers)
AHEAD_CACHE = 4096


class _Ahead:
    """For one load time: the points grid + lead + window_s at which the one-model path reads the survival
    function, worked out as _build_rows does (the row-free part of its _interp_rows, and the exponential
    tail beyond the histogram's span, which only the lead decides)."""

    def __init__(self, gd: _Grid, load_s: float) -> None:
        cfg = gd.cfg
        self.lead = load_s + cfg.tick_s + 5.0
        x = gd.grid + self.lead + cfg.window_s  # the same operations as _build_rows's row, so the same bits
        inside = x <= gd.span
        self.m = int(inside.sum())  # x grows with the grid: the first m points lie inside the span
        xi = x[:self.m]
        n = len(gd.edges)
        j, at_edge, jc, lo, exact = _interp_points(xi, gd.edges)
        # an exact point reads one edge's value: the first edge below the range, the last at its end
        self.node: list[int] = np.where(j < 0, 0, np.where(at_edge, n - 1, jc)).tolist()
        self.exact: list[bool] = exact.tolist()
        self.den: list[float] = (gd.edges[jc + 1] - lo).tolist()
        self.dx: list[float] = (xi - lo).tolist()
        self.beyond: list[float] = np.exp(-np.maximum(x[self.m:] - gd.span, 0.0) / cfg.tail_mean_s).tolist()


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
    gd = _grid_for(cfg)
    if len(inputs) <= ONE_BY_ONE:
        return [_build_one(h, oob, ld, gd) for h, oob, ld in inputs]
    out: list[ArrivalModel] = []
    for i in range(0, len(inputs), BATCH):
        out.extend(_build_rows(inputs[i:i + BATCH], gd))
    return out


# Up to this many models are built one by one in plain float arithmetic (_build_one): a replay's tick
# rebuilds one or two models at a time, where the 2-D path's ~40 numpy calls cost more than the numbers.
ONE_BY_ONE = 6


def _doubles(row: struct.Struct, xs: list[float]) -> array[float]:
    out = array("d")
    out.frombytes(row.pack(*xs))
    return out


def _pairwise_sum(a: tuple[float, ...], lo: int, n: int) -> float:
    """sum(a[lo:lo + n]) added up as numpy's add.reduce does (its pairwise summation: eight running sums
    in blocks of at most 128, halves above), so that the total has the same bits as h.sum(axis=1)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i = lo + 8
        end = lo + n - n % 8
        while i < end:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < lo + n:
            res += a[i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_sum(a, lo, n2) + _pairwise_sum(a, lo + n2, n - n2)


def _build_one(hist: tuple[float, ...] | None, oob: float, load_s: float, gd: _Grid) -> ArrivalModel:
    """_build_rows of one model in Python floats: the same operations in the same order on the same numbers
    (sums reversed as numpy's cumsum adds, the total as its pairwise sum, the exponential tail from numpy's
    exp in _Ahead), so the same bits; test_policy_arrivals.py holds the two paths to that."""
    cfg = gd.cfg
    nb = cfg.hist_bins
    total = 0.0 if hist is None else _pairwise_sum(hist, 0, nb)
    n = total + oob
    w0 = cfg.prior_weight
    denom = n + w0
    tail_mass = (oob + w0 * gd.prior_oob) / denom
    pm = gd.prior_mass_l
    s_edges = [0.0] * (nb + 1)
    acc = 0.0
    for i in range(nb - 1, -1, -1):
        acc += ((0.0 if hist is None else hist[i]) + pm[i]) / denom
        s_edges[i] = acc + tail_mass
    s_edges[nb] = 0.0 + tail_mass
    ah = gd.ahead_for(load_s)
    g = cfg.grid_s
    nk = len(gd.grid_j_l)
    gj, gexact, gden, gdx = gd.grid_j_l, gd.grid_exact_l, gd.grid_den_l, gd.grid_dx_l
    node, aexact, aden, adx, beyond = ah.node, ah.exact, ah.den, ah.dx, ah.beyond
    m = ah.m
    p_tail = 1.0 - math.exp(-(ah.lead + cfg.window_s) / cfg.tail_mean_s) if tail_mass > 1e-12 else 0.0

    # From the end, in one pass: S and p at each grid point (S read off the edges as np.interp does; p the chance
    # of a request within the lead and window), the mean residual life (trapezoids of S summed backwards as
    # numpy's cumsum of the reversed row, plus the tail) and the labels as _build_rows gives them: 1 hot, 2 cold
    # (p < p_release for `need` points ahead, the tail counting as an endless run of its own), 0 neither; a run
    # of one label is a segment, found from its end.
    p = [0.0] * nk
    mrl = [0.0] * nk
    names = ("", "hot", "cold")
    backwards: list[tuple[float, float, str]] = []
    end = nk  # the current run of `cur` ends at end (exclusive)
    cur = -1
    tm = tail_mass * cfg.tail_mean_s
    need = gd.need
    p_pre, p_rel = cfg.p_prefetch, cfg.p_release
    run = need if p_tail < p_rel else 0  # low points from i on, capped at need
    acc = 0.0
    nxt = s_edges[nb]
    for i in range(nk - 1, -1, -1):
        j = gj[i]
        y0 = s_edges[j]
        sd = y0 if gexact[i] else (s_edges[j + 1] - y0) / gden[i] * gdx[i] + y0
        if i < m:
            k = node[i]
            yk = s_edges[k]
            sa = yk if aexact[i] else (s_edges[k + 1] - yk) / aden[i] * adx[i] + yk
        else:
            sa = tail_mass * beyond[i - m]
        pi = (sd - sa) / sd if sd > 1e-12 else 0.0
        p[i] = pi
        acc += (sd + nxt) * 0.5 * g
        nxt = sd
        mrl[i] = (acc + tm) / sd if sd > 1e-12 else INF
        run = (run + 1 if run < need else need) if pi < p_rel else 0
        lab = 1 if pi >= p_pre else (2 if run >= need else 0)
        if lab != cur:
            if cur > 0:
                backwards.append((float((i + 1) * g), float(end * g), names[cur]))
            cur, end = lab, i + 1
    if cur > 0:
        backwards.append((0.0, float(end * g), names[cur]))
    segments = backwards[::-1]
    _add_tail(segments, p_tail, gd.span, cfg)
    return ArrivalModel(
        grid_s=g,
        p=_doubles(gd.row, p),
        mrl=_doubles(gd.row, mrl),
        p_tail=p_tail,
        mrl_tail=cfg.tail_mean_s if tail_mass > 1e-12 else INF,
        segments=tuple(segments),
        samples=n,
        tail_from=gd.span,
        tail_slope=_slope(cfg, oob),
    )


def _interp_points(x: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """np.interp's rule at the points x, the part that does not depend on the values: j, the edge at or
    below each point (edges[j] <= x < edges[j + 1]; -1 below the first); at_edge, at or beyond the last;
    jc, j clipped to a bin; lo, that bin's lower edge; exact, whether the point reads one edge's value."""
    n = len(edges)
    j = np.searchsorted(edges, x, side="right") - 1
    at_edge = j >= n - 1
    jc = np.clip(j, 0, n - 2)
    lo = edges[jc]
    exact = at_edge | (lo == x) | (j < 0)
    return j, at_edge, jc, lo, exact


def _interp_rows(x: np.ndarray, edges: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """np.interp(x[i], edges, ys[i]) for every row i (x: one row for all, or one per row of ys), computed
    as numpy's compiled interp does: below the first edge its value, at or beyond the last the last value,
    at an edge that edge's value, else slope × (x − edge) + value with slope = Δy / Δedge."""
    n = len(edges)
    j, at_edge, jc, lo, exact = _interp_points(x, edges)
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


def _add_tail(segments: list[tuple[float, float, str]], p_tail: float, span: float, cfg: PolicyConfig) -> None:
    """The tail beyond the grid, an endless run of its own label: it extends the last segment when that
    segment has the same label and reaches the grid's end, else it is a segment of its own."""
    tail_label = "hot" if p_tail >= cfg.p_prefetch else ("cold" if p_tail < cfg.p_release else "")
    if tail_label:
        if segments and segments[-1][2] == tail_label and segments[-1][1] == span:
            segments[-1] = (segments[-1][0], INF, tail_label)
        else:
            segments.append((span, INF, tail_label))


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
    need = gd.need
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
        _add_tail(segments, p_tail, span, cfg)
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
            tail_from=span,
            tail_slope=_slope(cfg, inputs[r][1]),
        ))
    return out
