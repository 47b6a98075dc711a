"""argparse types for the commands' numbers: a value no command can use is refused as the command line is read,
saying what to write instead. (Read later, `prewarm replay --speed 0` failed only once the web answered, as a
division by zero.)"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole_at_least(low: int) -> Callable[[str], int]:
    """A whole number >= `low`."""

    def parse(raw: str) -> int:
        try:
            n = int(raw)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number of at least {low}")
        return n

    return parse


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        return math.nan


def positive(raw: str) -> float:
    """A finite number above 0 (seconds, a speed, a rate)."""
    x = _number(raw)
    if not 0 < x < math.inf:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number above 0")
    return x


def non_negative(raw: str) -> float:
    """A finite number, 0 or more."""
    x = _number(raw)
    if not 0 <= x < math.inf:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of 0 or more")
    return x


def finite(raw: str) -> float:
    """Any finite number."""
    x = _number(raw)
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a finite number")
    return x


def port(raw: str) -> int:
    """A TCP port, 1 to 65535."""
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port (a whole number from 1 to 65535)")
    return n
