"""The two request-trace formats every reader takes (`prewarm simulate`, `simulator.diagnose`, the sweep, the
stream view and `prewarm replay`): what a header, a row, a minute's count and a request must be, and the words
that say what to fix. One home, so that a file one reader takes the others take too. Pure: the readers open the
files and put the file and line before the message (`at`).

- azure-minute: the Azure Functions 2019 per-minute counts. The columns in ID_COLUMNS name a function (any
  order; the simulator and the stream view need HashFunction, replay maps rows onto catalog models); every other
  column is a minute, headed `minute_N` or `N`. A cell is that minute's request count: a whole number, at least
  0; an empty cell is 0 (no request that minute).
- requests: a `timestamp,model` CSV, one row per request (other columns ignored). A timestamp is seconds or an
  ISO 8601 time (a trailing Z is UTC), and finite; the model is named.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Protocol

FORMATS = ("azure-minute", "requests")  # what --format accepts wherever a trace is read
ID_COLUMNS = frozenset({"HashOwner", "HashApp", "HashFunction", "Trigger"})
_MINUTE = re.compile(r"(?:minute_)?(\d+)")
MAX_SPAN_S = 366 * 86400  # the longest trace a reader takes (the bundled ones span 1 to 14 days)
NO_MINUTES = ("no minute columns in the header (azure-minute: e.g. HashFunction,minute_1,minute_2,…; a "
              "per-request file is --format requests)")


def at(path: str | Path, line: int | None, what: str) -> ValueError:
    """The refusal of a trace, naming the file and (where one is to blame) the line."""
    return ValueError(f"{path}, line {line}: {what}" if line is not None else f"{path}: {what}")


def minute_columns(header: Sequence[str]) -> list[tuple[int, int]]:
    """An azure-minute header's minute columns, as (column index, minute number) in file order."""
    out: list[tuple[int, int]] = []
    stray: list[str] = []
    for i, col in enumerate(header):
        if col in ID_COLUMNS:
            continue
        m = _MINUTE.fullmatch(col.strip())
        if m is None:
            stray.append(col)
        else:
            out.append((i, int(m.group(1))))
    if not out:
        raise ValueError(NO_MINUTES)
    if stray:
        raise ValueError(f"column {stray[0]!r} is neither a minute (minute_N or N) nor one of "
                         f"{', '.join(sorted(ID_COLUMNS))}")
    return out


def function_column(header: Sequence[str]) -> int:
    """Where an azure-minute header names each row's function (the model it stands for)."""
    if "HashFunction" not in header:
        raise ValueError("no HashFunction column in the header (azure-minute: HashOwner,HashApp,HashFunction,"
                         "minute_1,…; it names each row's model)")
    return list(header).index("HashFunction")


def check_row(row: Sequence[str], width: int) -> None:
    """A row has a field for every column of the header (more is let be: a trailing separator adds one)."""
    if len(row) < width:
        raise ValueError(f"{len(row)} fields where the header has {width}")


class RowReader(Protocol):
    """What csv.reader gives: rows, and the line the last one ended on."""

    line_num: int

    def __iter__(self) -> Iterator[list[str]]: ...


def rows(reader: RowReader, width: int, path: str | Path) -> Iterator[tuple[int, list[str]]]:
    """An azure-minute file's rows after its header, as (line, row): an empty row skipped, a short one refused
    (check_row) naming its line."""
    for row in reader:
        if not row:
            continue
        try:
            check_row(row, width)
        except ValueError as e:
            raise at(path, reader.line_num, str(e)) from None
        yield reader.line_num, row


def count(cell: str) -> int:
    """A minute's request count: a whole number, at least 0; an empty cell is 0."""
    if not cell:
        return 0
    try:
        c = int(cell)
    except ValueError:
        raise ValueError(f"{cell!r} is not a request count (a whole number)") from None
    if c < 0:
        raise ValueError(f"a request count is negative ({c})")
    return c


def request_columns(fieldnames: Sequence[str] | None) -> None:
    """A requests header names both columns."""
    missing = {"timestamp", "model"} - set(fieldnames or ())
    if missing:
        raise ValueError(f"no {' or '.join(sorted(missing))} column (requests: timestamp,model; a file of "
                         "per-minute counts is --format azure-minute)")


def request(timestamp: str | None, model: str | None) -> tuple[float, str]:
    """One request row: (seconds, model)."""
    if not model:
        raise ValueError("a request needs a model")
    s = (timestamp or "").strip()
    try:
        t = float(s)
    except ValueError:
        try:
            t = datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ValueError(f"timestamp {timestamp!r} is neither seconds nor an ISO 8601 time") from None
    if not math.isfinite(t):
        raise ValueError(f"timestamp {timestamp!r} is not a finite time")
    return t, model


class DictRowReader(Protocol):
    """What csv.DictReader gives: its header, rows by column, and the line the last one ended on."""

    line_num: int

    @property
    def fieldnames(self) -> Sequence[str] | None: ...

    def __iter__(self) -> Iterator[dict[str, str | None]]: ...


def requests(reader: DictRowReader, path: str | Path) -> Iterator[tuple[float, str]]:
    """A requests file's rows after its header, as (seconds, model) in file order: the header and each row checked
    (request_columns, request), a refusal naming the file and line."""
    try:
        request_columns(reader.fieldnames)
    except ValueError as e:
        raise at(path, 1, str(e)) from None
    for row in reader:
        try:
            yield request(row["timestamp"], row["model"])
        except ValueError as e:
            raise at(path, reader.line_num, str(e)) from None


def check_span(span_s: float) -> None:
    """A trace spans at most MAX_SPAN_S: longer is seconds and milliseconds mixed in one file, as a rule (replayed,
    it ran without end)."""
    if span_s > MAX_SPAN_S:
        raise ValueError(f"the trace spans {span_s / 86400:,.0f} days, past the {MAX_SPAN_S // 86400} a replay takes; "
                         "are seconds and milliseconds mixed?")
