"""argparse types for the commands' numbers, sizes and output files: a value no command can use is refused as the
command line is read, saying what to write instead. (Read later, `prewarm replay --speed 0` failed only once the web
answered, as a division by zero, and `prewarm simulate --json` into a missing folder only after the whole replay.)
Used by the programs and the simulator's commands."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Sequence

from prewarm.units import parse_bytes, parse_rate


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


def names_of(known: Sequence[str]) -> Callable[[str], list[str]]:
    """A comma list of names from `known` (in the order written), or `all` for every one of them."""

    def parse(raw: str) -> list[str]:
        items = [x.strip() for x in raw.split(",") if x.strip()]
        if items == ["all"]:
            return list(known)
        bad = [x for x in items if x not in known]
        if bad or not items:
            what = f"unknown {', '.join(bad)}" if bad else "names none"
            raise argparse.ArgumentTypeError(f"{what} (known: {', '.join(known)}, or all)")
        return items

    return parse


def wholes_at_least(low: int) -> Callable[[str], list[int]]:
    """A comma list of whole numbers >= `low` (fleet sizes, seeds)."""
    one = whole_at_least(low)

    def parse(raw: str) -> list[int]:
        items = [x.strip() for x in raw.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{raw!r} names no number: write a comma list such as {low},{low + 1}")
        return [one(x) for x in items]

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


MAX_PORT = 65535  # TCP's; the settings' PORT variables are read against it too


def port(raw: str) -> int:
    """A TCP port, 1 to MAX_PORT."""
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port (a whole number from 1 to {MAX_PORT})")
    return n


def port_or_off(raw: str) -> int:
    """A TCP port, or 0 for none (a metrics port that may be switched off)."""
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port (a whole number from 1 to {MAX_PORT}) or 0 (off)")
    return n


def size_at_least(low: int) -> Callable[[str], int]:
    """A size in bytes (prewarm.units: 80GiB, 512MB, 1073741824) of at least `low` bytes."""

    def parse(raw: str) -> int:
        try:
            n = parse_bytes(raw)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a size of at least {low:,} bytes" if low > 1
                                             else f"{raw!r} is not a size above 0")
        return n

    return parse


def rate(raw: str) -> float:
    """A bandwidth above 0 in bytes per second: a size, with or without /s (2GiB/s, 2GiB, 2147483648)."""
    try:
        x = parse_rate(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a bandwidth above 0")
    return x


def output_file(raw: str) -> str:
    """A file a command will write at its end: refused now if it cannot be (a missing folder, a folder in its place,
    no write permission), so a long run is not lost at its last step. Nothing is left behind by the check."""
    if not raw:
        raise argparse.ArgumentTypeError("an empty file name")
    if os.path.isdir(raw):
        raise argparse.ArgumentTypeError(f"{raw!r} is a folder; name a file in it")
    parent = os.path.dirname(raw) or "."
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"cannot write {raw!r}: there is no folder {parent!r}")
    try:
        if os.path.exists(raw):
            open(raw, "r+b").close()  # opened for writing, not truncated: an earlier file stays as it was
        else:
            open(raw, "xb").close()
            os.unlink(raw)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {raw!r}: {e.strerror or e}") from None
    return raw


def output_folder(raw: str) -> str:
    """A folder a command will write its files into (made, with its parents, when the command starts): refused now
    if it cannot be (a file in its place or on its path, no write permission where it would be made). Nothing is
    left behind by the check."""
    if not raw:
        raise argparse.ArgumentTypeError("an empty folder name")
    path = os.path.abspath(raw)
    probe = path
    while not os.path.exists(probe):  # the nearest existing folder on the path: where it would be made
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        where = "is a file" if probe == path else f"lies under the file {probe!r}"
        raise argparse.ArgumentTypeError(f"cannot write into {raw!r}: it {where}")
    try:
        tempfile.TemporaryFile(dir=probe).close()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write into {raw!r}: {e.strerror or e} ({probe})") from None
    return raw
