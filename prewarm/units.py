"""Sizes in bytes and durations in seconds, as every command, setting, catalog and profile reads them: one reader
each, so that `80GB` means the same bytes to `prewarm simulate --gpu-memory`, `PREWARM_DEVICES` and `prewarm bench
tick` (decimal units are powers of 1000, binary ones of 1024, as IEC 80000-13 has them), and `6h` the same seconds
to a catalog's max_replica_age and a simulator profile's."""

from __future__ import annotations

import re

GIB = 1 << 30

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
         "g": 1000**3, "gb": 1000**3, "gib": GIB, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_bytes(text: str) -> int:
    """'4GiB' -> 4294967296; '512MB' -> 512000000; '1024' -> 1024 (ValueError saying what to write)."""
    m = _SIZE.fullmatch(str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"cannot read {text!r} as a size: write e.g. 4GiB, 512MiB or 1073741824")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def parse_rate(text: str) -> float:
    """A bandwidth in bytes per second: a size, with or without '/s' ('2GiB/s', '2GiB', '2147483648')."""
    s = str(text).strip()
    return float(parse_bytes(s[:-2] if s.lower().endswith("/s") else s))


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smh]?)\s*")


def parse_duration(text: str) -> float:
    """'15m' -> 900.0; '10s' -> 10.0; '1h' -> 3600.0; '90' -> 90.0 (seconds)."""
    m = _DURATION.fullmatch(str(text))
    if not m:
        raise ValueError(f"cannot read {text!r} as a duration: write e.g. 10s, 15m or 1h")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]
