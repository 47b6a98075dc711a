"""forecast: the baseline an operator gets from a load-forecasting autoscaler. The rule itself lives in
`prewarm.domain.baselines.forecast` (see its docstring for the source and the rules); here the
statsmodels reference its vectorised fit (`fit_ses_grid`) is checked against."""

from __future__ import annotations

import warnings

import numpy as np

from prewarm.domain.baselines.forecast import ALPHAS, Forecast, fit_ses_grid

__all__ = ["ALPHAS", "Forecast", "fit_ses", "fit_ses_grid"]


def fit_ses(y: np.ndarray) -> tuple[float, float]:
    """(α, next-minute forecast) of statsmodels' SimpleExpSmoothing fitted on the series y, initial
    level y[0]: the reference `fit_ses_grid` is checked against."""
    from statsmodels.tsa.holtwinters import SimpleExpSmoothing

    y = np.asarray(y, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on short / flat series
        fit = SimpleExpSmoothing(y, initialization_method="known", initial_level=float(y[0])).fit()
    return float(fit.params["smoothing_level"]), float(fit.forecast(1)[0])
