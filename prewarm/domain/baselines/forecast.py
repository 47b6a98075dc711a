"""forecast: the baseline an operator gets from a load-forecasting autoscaler.

Source: NVIDIA Dynamo's planner forecasts each deployment's request rate with a standard
time-series predictor (constant, ARIMA, Prophet or a Kalman filter: "Load Prediction" in
https://docs.nvidia.com/dynamo/ components/planner, SLA-based planner) and scales replicas to the
forecast. Here the forecaster is simple exponential smoothing (Holt-Winters with neither trend nor
season; the same forecasts as ARIMA(0,1,1)), Hyndman & Athanasopoulos, "Forecasting: Principles and
Practice", 3rd ed., section 8.1: α chosen per model by least squares of the one-step errors with
the initial level at the first observation, which is what statsmodels'
`SimpleExpSmoothing(y, initialization_method="known", initial_level=y[0]).fit()` computes (its
brute-force grid stage, followed there by a local optimiser). statsmodels needs 60-120 ms per fit,
so fitting ~400 active models every 15 simulated minutes would take ~40 min of CPU a day; here the
same least-squares fit runs vectorised over all models on a grid of α (`fit_ses_grid`, ~20 ms per
refit), and a test checks it against statsmodels (`fit_ses`).

Per model, on per-minute request counts observed so far (causal: nothing from the future):
- every `tick_s` (60 s): the forecast level is updated with the minute just ended,
  level ← level + α (count − level), vectorised over all models (numpy);
- every `refit_s` (15 simulated minutes): α and the level are refitted on the last
  `window_min` minutes, for every model with at least `min_active_minutes` non-zero minutes there
  (the others keep their α; their level decays with each zero minute);
- the forecast rate λ = level / 60 requests per second gives P(a request within the model's load
  time + one tick) = 1 − exp(−λ (load + tick)) under Poisson arrivals. A model with P ≥ `threshold`
  is kept loaded and, when not resident, pre-loaded (highest P first) on a GPU with room or by
  evicting replicas of models below the threshold only;
- a request for a model with no replica loads it on demand, as every policy does; when memory is
  short the victims are the replicas below the threshold first, least recently used first, then
  the others, least recently used first (LRU).
A replica whose forecast falls below the threshold is not unloaded at once: it becomes a first
victim. Unloading memory no load needs could only add cold starts, and an operator tuning such an
autoscaler for cold starts would not scale to zero with memory to spare.
"""

from __future__ import annotations

import numpy as np

from prewarm.domain.action_kinds import DEMAND, FORECAST

from .base import Fleet, ReplicaLike, Rule, recency

ALPHAS = np.linspace(0.02, 1.0, 50)  # the fit's grid of smoothing levels


def fit_ses_grid(w: np.ndarray, alphas: np.ndarray = ALPHAS) -> tuple[np.ndarray, np.ndarray]:
    """Simple exponential smoothing fitted to every column of w (minutes × models) at once: per column
    the α of `alphas` with the least sum of squared one-step errors (the first of equals), and the
    forecast for the minute after w. Initial level: the column's first value."""
    a = alphas[:, None]
    level = np.repeat(w[:1], len(alphas), axis=0)  # (grid, models)
    sse = np.zeros_like(level)
    for y in w[1:]:
        e = y - level
        sse += e * e
        level += a * e
    best = np.argmin(sse, axis=0)
    cols = np.arange(w.shape[1])
    return alphas[best], level[best, cols]


class Forecast(Rule):
    """forecast: per-model request-rate forecasts (statsmodels' simple exponential smoothing) and a
    keep / pre-load threshold on P(request within load time + one tick); LRU when memory is short.
    See the module docstring for the source and the rules."""

    name = "forecast"
    tick_s: float | None = 60.0
    refit_s = 900.0
    window_min = 240
    min_active_minutes = 3
    threshold = 0.3  # the same probability prewarm's p_prefetch uses for "hot", not tuned
    alpha0 = 0.5  # α of a model not fitted yet

    def attach(self, fleet: Fleet) -> None:
        super().attach(fleet)
        n = fleet.n_models
        self.count = np.zeros(n)  # requests in the minute in progress
        self.counts = [0] * n  # the same, as Python ints (a scalar += on numpy is slow)
        self.hist = np.zeros((self.window_min, n))  # ring buffer of per-minute counts
        self.filled = 0  # minutes in the ring
        self.alpha = np.full(n, self.alpha0)
        self.level = np.zeros(n)  # forecast requests in the next minute
        self.horizon = np.array(fleet.load_s) + float(self.tick_s or 0.0)
        self.hot = np.zeros(n, dtype=bool)
        self.p = np.zeros(n)
        self.fits = 0
        self.next_refit = self.refit_s

    def on_request(self, t: float, m: int, warm: bool) -> None:
        self.counts[m] += 1

    def _key(self, r: ReplicaLike) -> float:
        return recency(self.fleet, r) + (1e12 if self.hot[r.model] else 0.0)  # below-threshold replicas go first

    def on_miss(self, t: float, m: int) -> None:
        self.fleet.place_evicting(m, self._key, kind=DEMAND)

    def observe(self, t: float) -> None:
        """The minute ending at t: update every model's level; refit when a refit period ends."""
        y = np.asarray(self.counts, dtype=float)
        self.counts = [0] * self.fleet.n_models
        self.hist[self.filled % self.window_min] = y
        self.filled += 1
        self.level += self.alpha * (y - self.level)
        if t + 1e-9 >= self.next_refit:
            self.next_refit += self.refit_s
            self.refit()
        lam = np.maximum(self.level, 0.0) / 60.0
        self.p = -np.expm1(-lam * self.horizon)
        self.hot = self.p >= self.threshold

    def window(self) -> np.ndarray:
        """The ring's minutes in time order (oldest first): shape (minutes, models)."""
        k = min(self.filled, self.window_min)
        start = self.filled - k
        idx = [(start + i) % self.window_min for i in range(k)]
        return self.hist[idx]

    def refit(self) -> None:
        w = self.window()
        if len(w) < 10:
            return
        active = np.flatnonzero((w > 0).sum(axis=0) >= self.min_active_minutes)
        if not len(active):
            return
        alpha, nxt = fit_ses_grid(w[:, active])
        self.alpha[active] = alpha
        self.level[active] = np.maximum(nxt, 0.0)
        self.fits += len(active)

    def on_tick(self, t: float) -> None:
        if t <= 0.0:
            return  # no minute has ended yet
        self.observe(t)
        s = self.fleet
        want = [m for m in np.flatnonzero(self.hot & (self.p > 0)).tolist() if not s.replicas[m]]
        want.sort(key=lambda m: (-self.p[m], m))
        for m in want:
            s.place_evicting(m, self._key, only_if=lambda r: not self.hot[r.model], kind=FORECAST)
