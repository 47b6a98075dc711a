"""The bounds a catalog entry's numbers are checked against: the size of a model input (which the
worker's `infer` requests are checked against too: one rule for both), and BOUNDS, every numeric field's
range, with the checks that word a value out of them as the entry's CatalogError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prewarm.catalog_entries import entry_error

# Bounds on what a model is asked to run (one home: the catalog's warmup entries and the worker's infer
# requests check against these). A [1000000, 64] warmup on a tiny MLP once cost the worker 1.8 GB.
MAX_INPUT_ELEMENTS = 1 << 22  # elements of one torch input (the product of its shape): 16 MiB of float32
MAX_INPUT_DIMS = 8
MAX_INPUT_TOKENS = 1 << 16  # tokens of one checkpoint-runtime input (prompt_tokens x batch)
MAX_WARMUP_INPUTS = 16  # warmup entries per model: each may take PREWARM_WARMUP_MAX_SECONDS


@dataclass(frozen=True)
class Bound:
    """A numeric field's range (inclusive): every real fleet's values lie well inside it, and a value out
    of it (nan, inf, 5e-324, a typo's extra digits) would only break what reads it later (the planner
    divides by max_rate_per_replica; the worker allocates warmup shapes)."""

    low: float
    high: float
    integer: bool = False
    unit: str = ""  # shown after the range, e.g. "requests/s"

    def text(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        unit = f" ({self.unit})" if self.unit else ""
        return f"{kind} between {_show(self.low)} and {_show(self.high)}{unit}"


def _show(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


TIB = 1 << 40
# One home for every numeric field's range (prewarm.catalog's docstring and the README list them).
BOUNDS: dict[str, Bound] = {
    "min_replicas": Bound(0, 64, integer=True),
    "max_rate_per_replica": Bound(0.001, 1e6, unit="requests/s"),
    # a duration: prewarm.catalog's _max_age words it; under 1 s a replica would reload about as fast as it loads
    "max_replica_age": Bound(1.0, 365 * 86400.0, unit="seconds"),
    "warmup_entries": Bound(1, MAX_WARMUP_INPUTS, integer=True),
    "shape": Bound(1, MAX_INPUT_ELEMENTS, integer=True),  # each dimension
    "high": Bound(1, 1 << 31, integer=True),
    "prompt_tokens": Bound(1, MAX_INPUT_TOKENS, integer=True),
    "batch": Bound(1, 4096, integer=True),
    "kv_cache_bytes": Bound(1, 16 * TIB, integer=True, unit="bytes, up to 16 TiB"),
    "engine_bytes": Bound(0, 16 * TIB, integer=True, unit="bytes, up to 16 TiB"),
    "max_adapters": Bound(1, 256, integer=True),
    "max_cpu_adapters": Bound(1, 4096, integer=True),
    "rank": Bound(1, 512, integer=True),
}


def check_number(where: str, name: str, raw: object) -> Any:
    """`raw` if it is a number within BOUNDS[name], else the entry's CatalogError:
    "max_rate_per_replica must be a finite number between 0.001 and 1,000,000 (requests/s), got nan".
    A bool is not a number here (TOML's true is not 1)."""
    b = BOUNDS[name]
    if in_bounds(raw, b):
        return raw
    raise entry_error(where, f"{name} must be {b.text()}, got {raw!r}")


def in_bounds(raw: object, b: Bound) -> bool:
    """`raw` is a number within `b` (a bool is not a number here)."""
    if isinstance(raw, bool) or not isinstance(raw, int if b.integer else int | float):
        return False
    # an int is exact (and may be too large for a float); a float must be finite
    return (isinstance(raw, int) or math.isfinite(raw)) and b.low <= raw <= b.high  # type: ignore[operator]


def check_warmup_list(where: str, raw: object, what: str) -> list:
    """The [[models.warmup]] tables: a list of 1 to BOUNDS["warmup_entries"].high of them."""
    if not isinstance(raw, list) or not raw:
        raise entry_error(where, f"warmup must be a non-empty list of [[models.warmup]] tables with {what}")
    most = BOUNDS["warmup_entries"].high
    if len(raw) > most:
        raise entry_error(where, f"warmup has {len(raw):,} entries; at most {_show(most)} (each runs at every load)")
    return raw


def check_shape(where: str, shape: object) -> tuple[int, ...]:
    """A warmup entry's shape: 1 or more dimensions within BOUNDS["shape"], a request's size at most."""
    each = BOUNDS["shape"]
    if not isinstance(shape, list) or not shape or not all(in_bounds(d, each) for d in shape):
        raise entry_error(where, f"shape {shape!r} must be a non-empty list of integers, each between {_show(each.low)} "
                                 f"and {_show(each.high)}")
    if (too_big := check_input_shape(shape)) is not None:
        raise entry_error(where, f"shape {shape!r} {too_big}: warm with a shape a request would have")
    return tuple(shape)


def check_input_shape(shape: list[int] | tuple[int, ...]) -> str | None:
    """Why a torch input of `shape` (positive integers) is too large, or None when it is within the bounds."""
    if len(shape) > MAX_INPUT_DIMS:
        return f"has {len(shape)} dims; at most {MAX_INPUT_DIMS} (MAX_INPUT_DIMS) are allowed"
    n = math.prod(shape)
    if n > MAX_INPUT_ELEMENTS:
        return f"has {n:,} elements; at most {MAX_INPUT_ELEMENTS:,} (MAX_INPUT_ELEMENTS) are allowed per input"
    return None

