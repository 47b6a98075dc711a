"""arrivals.build_many (every model's arrival model in one pass of 2-D numpy arrays) against the per-model
build it replaced: bit for bit, for histograms of every shape, load times and configs."""

from __future__ import annotations

import math
import random
from array import array

import numpy as np
import pytest

from prewarm.domain.policy import PolicyConfig, arrivals
from prewarm.domain.policy.arrivals import ArrivalModel

INF = math.inf


def _doubles(x: np.ndarray) -> array[float]:
    out = array("d")
    out.frombytes(np.ascontiguousarray(x, dtype=np.float64).tobytes())
    return out


def reference_build(
    hist: tuple[float, ...] | None, oob: float, load_s: float, cfg: PolicyConfig
) -> ArrivalModel:
    """arrivals.build as it was, one model at a time (main at 63c0918): what build_many must match."""
    gd = arrivals._Grid(cfg)
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
    s_fine = np.interp(np.append(gd.grid, span), edges, s_edges)  # surv() at the grid and its end, all inside
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


def _histograms(rnd: random.Random, bins: int, n: int) -> list[tuple[tuple[float, ...] | None, float, float]]:
    out: list[tuple[tuple[float, ...] | None, float, float]] = []
    for i in range(n):
        kind = i % 6
        h = [0.0] * bins
        if kind == 0:
            hist = None  # no idle time yet: the prior alone
        elif kind == 1:  # one or two gaps
            for _ in range(rnd.randrange(1, 3)):
                h[rnd.randrange(bins)] += 1.0
            hist = tuple(h)
        elif kind == 2:  # periodic: one bin, halved counts
            h[rnd.randrange(bins)] = rnd.randrange(1, 2048) * 0.5
            hist = tuple(h)
        elif kind == 3:  # busy: most gaps in the first bins
            for b in range(min(bins, 5)):
                h[b] = float(rnd.randrange(0, 3000)) / rnd.choice((1, 2, 4))
            hist = tuple(h)
        elif kind == 4:  # everywhere
            hist = tuple(rnd.random() * rnd.choice((1, 10, 1000)) for _ in range(bins))
        else:  # all zeros but out of bounds
            hist = tuple(h)
        oob = 0.0 if kind in (0, 3) else rnd.choice((0.0, 1.0, 2.5, float(rnd.randrange(5000))))
        load_s = rnd.choice((0.5, 2.0, 4.0, 17.3, 60.0, 400.0, rnd.uniform(0.1, 900.0)))
        out.append((hist, oob, load_s))
    return out


def _same(a: ArrivalModel, b: ArrivalModel) -> bool:
    return (a.grid_s == b.grid_s and a.p.tobytes() == b.p.tobytes() and a.mrl.tobytes() == b.mrl.tobytes()
            and a.p_tail == b.p_tail and a.mrl_tail == b.mrl_tail and a.segments == b.segments
            and a.samples == b.samples)


@pytest.mark.parametrize("cfg", [
    PolicyConfig(),
    PolicyConfig(grid_s=60.0, hist_bins=120, window_s=30.0, p_prefetch=0.5, release_min_gap_s=90.0),
    PolicyConfig(grid_s=10.0, hist_bin_s=30.0, hist_bins=60, tail_mean_s=600.0, prior_weight=0.5, p_release=0.2),
])
def test_build_many_gives_each_model_bit_for_bit_what_the_per_model_build_gave(cfg: PolicyConfig) -> None:
    inputs = _histograms(random.Random(3), cfg.hist_bins, arrivals.BATCH + 97)  # across a batch boundary
    many = arrivals.build_many(inputs, cfg)
    assert len(many) == len(inputs)
    wrong = [i for i, ((h, oob, ld), am) in enumerate(zip(inputs, many, strict=True))
             if not _same(am, reference_build(h, oob, ld, cfg))]
    assert wrong == []
    # one at a time, and in another order, the same models
    assert all(_same(arrivals.build(h, oob, ld, cfg), am) for (h, oob, ld), am in zip(inputs[:50], many[:50], strict=True))
    back = arrivals.build_many(inputs[::-1], cfg)
    assert all(_same(a, b) for a, b in zip(back[::-1], many, strict=True))
    # the models differ from one another (the comparison is not of constants)
    assert len({am.segments for am in many}) > 20 and len({am.p.tobytes() for am in many}) > 100


@pytest.mark.parametrize("cfg", [
    PolicyConfig(),
    PolicyConfig(grid_s=60.0, hist_bins=120, window_s=30.0, p_prefetch=0.5, release_min_gap_s=90.0),
    PolicyConfig(grid_s=10.0, hist_bin_s=30.0, hist_bins=60, tail_mean_s=600.0, prior_weight=0.5, p_release=0.2),
    PolicyConfig(window_s=3000.0, tail_mean_s=900.0),  # the last fifth of the points read the tail
])
def test_the_one_model_path_gives_the_2d_paths_bits(cfg: PolicyConfig) -> None:
    """A replay's tick rebuilds a model or two, in Python floats (_build_one); a starting scheduler builds
    thousands in 2-D numpy (_build_rows): each model must come out the same either way."""
    inputs = _histograms(random.Random(11), cfg.hist_bins, 600)
    rows = arrivals._build_rows(inputs, arrivals._Grid(cfg))
    ones = [arrivals._build_one(h, oob, ld, arrivals._grid_for(cfg)) for h, oob, ld in inputs]
    assert [i for i, (a, b) in enumerate(zip(rows, ones, strict=True)) if not _same(a, b)] == []
    # build_many takes the one-model path for a few models and the 2-D one for many: both meet the reference
    few = inputs[:arrivals.ONE_BY_ONE]
    assert all(_same(a, reference_build(h, oob, ld, cfg))
               for (h, oob, ld), a in zip(few, arrivals.build_many(few, cfg), strict=True))
    assert len({am.segments for am in ones}) > 20 and len({am.p.tobytes() for am in ones}) > 100


def test_beyond_the_histogram_the_expected_wait_grows_with_the_silence() -> None:
    """Past the histogram's span the mean residual life is the tail's posterior one: tail_mean_s plus the excess
    silence over (alpha - 1 + k), k the idle times seen past the span. A model silent for a day is expected to stay
    silent longer than one silent for 5 h; one seen often to come back after long gaps waits less longer. Both
    build paths carry it; a prior with alpha = 1 and no long gap seen leaves the exponential tail's mean."""
    cfg = PolicyConfig()
    span = cfg.hist_bins * cfg.hist_bin_s
    hist = tuple(1.0 if i % 7 == 0 else 0.0 for i in range(cfg.hist_bins))
    gd = arrivals._grid_for(cfg)
    day = 24 * 3600.0
    for oob in (0.0, 3.0):
        one = arrivals._build_one(hist, oob, 5.0, gd)
        rows = arrivals._build_rows([(hist, oob, 5.0), (None, 1.0, 9.0)], gd)[0]
        for m in (one, rows):
            assert m.mrl_at(span) == cfg.tail_mean_s
            assert m.mrl_at(5 * 3600.0) < m.mrl_at(day)
            assert m.mrl_at(day) == pytest.approx(cfg.tail_mean_s + (day - span) / (cfg.prior_alpha - 1.0 + oob))
    seen_often = arrivals._build_one(hist, 10.0, 5.0, gd)
    assert seen_often.mrl_at(day) < arrivals._build_one(hist, 0.0, 5.0, gd).mrl_at(day)
    flat = PolicyConfig(prior_alpha=1.0)
    assert arrivals._build_one(hist, 0.0, 5.0, arrivals._grid_for(flat)).mrl_at(day) == flat.tail_mean_s
