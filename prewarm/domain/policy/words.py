"""Numbers as the decision log's reasons write them."""

from __future__ import annotations

import math


def fmt_s(x: float | None) -> str:
    if x is None or math.isinf(x):
        return "never"
    if x < 120:
        return f"{x:.0f} s"
    if x < 7200:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.1f} h"


def num(x: float | None) -> float:
    return -1.0 if x is None or math.isinf(x) else float(x)


