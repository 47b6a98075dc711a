"""Trace and profile loading.

`read_trace` is the one reader dispatch (`prewarm simulate`, `simulator.diagnose` and the sweep). Formats (what a
header, a cell and a timestamp must be: prewarm.domain.trace_format, the rules `prewarm replay` reads by too):
- azure-minute: Azure Functions 2019 per-minute counts. Header `HashOwner,HashApp,HashFunction[,Trigger]`
  (any order) then one column per minute, headed by the minute number or `minute_N`. A row is a
  model, named by its HashFunction. The requests of each minute are placed at uniformly random
  times within that minute, drawn with numpy's default_rng(seed) in row-major order — this one
  spreading rule is the default everywhere, because it moves every figure. Time 0 is the start of
  the first minute column.
- requests: CSV with header `timestamp,model` (Unix seconds or ISO 8601), one row per request;
  other columns ignored. Time 0 is the first request.

Profile CSV `model,size_bytes,load_seconds[,priority][,max_replica_age]` (the last two: catalog fields,
optional; see load_profile_fields). Without one (or for a model it lacks), sizes are
drawn from a log-normal with median 1.5 GiB, sigma 1.2, clipped to 0.05..70 GiB, seeded by a hash
of the model id; load time = 1.5 s + size at 2 GiB/s + 0.1 s warmup per GiB — the same rule that
made the profiles in ../shared/traces.
"""

from __future__ import annotations

import csv
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prewarm import priority as priorities
from prewarm.catalog_bounds import BOUNDS, in_bounds
from prewarm.domain import trace_format as tf
from prewarm.domain.policy.types import PolicyConfig
from prewarm.units import GIB, parse_bytes, parse_duration

AGE = BOUNDS["max_replica_age"]  # a profile's max_replica_age, as the catalog's

# every simulator command's GPU unless told (--gpu-memory): an 80 GiB H100 / A100
GPU_MEMORY = "80GiB"
GPU_BYTES = parse_bytes(GPU_MEMORY)
_POLICY_DEFAULTS = PolicyConfig()
ID_COLUMNS = tf.ID_COLUMNS


@dataclass
class Trace:
    models: list[str]  # index -> model id
    times: np.ndarray  # float64 seconds, sorted
    mids: np.ndarray  # int32 model index per request
    span_s: float
    source: str
    fmt: str

    @property
    def requests(self) -> int:
        return int(len(self.times))

    def per_model_times(self) -> list[np.ndarray]:
        """Each model's request times in order, by model index (what the oracle and the diagnostics look ahead in)."""
        order = np.argsort(self.mids, kind="stable")
        bounds = np.searchsorted(self.mids[order], np.arange(len(self.models) + 1))
        times = self.times[order]
        return [times[bounds[m]:bounds[m + 1]] for m in range(len(self.models))]


def first_hours(trace: Trace, hours: float) -> Trace:
    """The trace's requests in its first `hours` (the same models, so sizes and load times stay the same)."""
    span = hours * 3600.0
    keep = trace.times < span
    return Trace(trace.models, trace.times[keep], trace.mids[keep], min(trace.span_s, span),
                 f"{trace.source} (first {hours:g} h)", trace.fmt)


def load_azure_minute(path: str | Path, seed: int = 0) -> Trace:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None) or []
        try:
            fn_col = tf.function_column(header)
            cols = tf.minute_columns(header)
        except ValueError as e:
            raise tf.at(path, 1, str(e)) from None
        minute_cols = [i for i, _n in cols]
        minutes = np.array([n for _i, n in cols], dtype=np.int64)
        names: list[str] = []
        rows: list[list[str]] = []
        for _line, row in tf.rows(reader, len(header), path):
            names.append(row[fn_col])
            rows.append([row[i] for i in minute_cols])
    try:
        counts = np.array(rows, dtype=np.int64) if rows else np.zeros((0, len(minute_cols)), dtype=np.int64)
        if (counts < 0).any():
            raise ValueError("negative")
    except ValueError:  # the rule's own reading, cell by cell: an empty cell is 0, a bad one is named
        counts = np.array([[_count(path, names[r], header[minute_cols[c]], x) for c, x in enumerate(cells)]
                           for r, cells in enumerate(rows)], dtype=np.int64)
    first = int(minutes.min())
    r_idx, c_idx = np.nonzero(counts)  # row-major order: deterministic draw order
    n = counts[r_idx, c_idx]
    mids = np.repeat(r_idx.astype(np.int32), n)
    starts = np.repeat((minutes[c_idx] - first).astype(np.float64) * 60.0, n)
    rng = np.random.default_rng(seed)
    times = starts + rng.random(len(starts)) * 60.0
    order = np.argsort(times, kind="stable")
    span = float((int(minutes.max()) - first + 1) * 60)
    return Trace(names, times[order], mids[order], span, str(path), "azure-minute")


def _count(path: str | Path, name: str, column: str, cell: str) -> int:
    try:
        return tf.count(cell)
    except ValueError as e:
        raise tf.at(path, None, f"function {name!r}, minute {column}: {e}") from None


def load_requests(path: str | Path) -> Trace:
    names: dict[str, int] = {}
    ts: list[float] = []
    ms: list[int] = []
    with open(path, newline="") as f:
        for t, m in tf.requests(csv.DictReader(f), path):
            ts.append(t)
            ms.append(names.setdefault(m, len(names)))
    times = np.array(ts, dtype=np.float64)
    mids = np.array(ms, dtype=np.int32)
    order = np.argsort(times, kind="stable")
    times, mids = times[order], mids[order]
    if len(times):
        times = times - times[0]
    span = float(times[-1]) if len(times) else 0.0
    return Trace(list(names), times, mids, span, str(path), "requests")


FORMATS = tf.FORMATS  # what --format accepts in simulate, diagnose and the sweep


def read_trace(path: str | Path, fmt: str = "azure-minute", seed: int = 0, hours: float | None = None) -> Trace:
    """The one reader dispatch (`simulate`, `diagnose` and the sweep): the trace at `path` in format
    `fmt` (one of FORMATS; `seed` spreads azure-minute counts), cut to its first `hours` when given.
    Bad input is a ValueError (OSError when the file cannot be read)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    if hours is not None and not hours > 0:
        raise ValueError(f"--hours must be positive, got {hours:g}")
    if seed < 0:  # numpy's own words ("expected non-negative integer") do not say which option
        raise ValueError(f"--seed must be a whole number of at least 0, got {seed}")
    trace = load_azure_minute(path, seed) if fmt == "azure-minute" else load_requests(path)
    trace = trace if hours is None else first_hours(trace, hours)
    try:
        tf.check_span(trace.span_s)
    except ValueError as e:
        raise tf.at(path, None, f"{e} (--hours replays the first hours only)") from None
    return trace


def default_size(model: str) -> int:
    """Seeded by the model id: log-normal, median 1.5 GiB, sigma 1.2, clipped to 0.05..70 GiB."""
    seed = int.from_bytes(hashlib.sha256(model.encode()).digest()[:8], "little")
    z = np.random.default_rng(seed).standard_normal()
    gib = min(70.0, max(0.05, 1.5 * math.exp(1.2 * z)))
    return int(gib * GIB)


def default_load_seconds(size_bytes: int) -> float:
    """A model's load time without a profile's: the policy's own default (PolicyConfig: 1.5 s + size at 2 GiB/s +
    0.1 s per GiB of warmup), so that a generated profile and the policy's guess for an unmeasured model agree."""
    return _POLICY_DEFAULTS.default_load_seconds(size_bytes)


PROFILE_COLUMNS = ("model", "size_bytes", "load_seconds")  # a profile's required header


class ProfileError(ValueError):
    """A profile CSV that cannot be read as one; the message names the file, the line and what to fix."""


@dataclass(frozen=True)
class Profile:
    """A profile file read once (read_profile): what load_profile, load_profile_fields and the adapters' columns
    take in place of its path, so that one simulation reads the file once. Printed, it is its path."""

    path: str
    rows: tuple[tuple[int, dict[str, str]], ...]

    def __str__(self) -> str:
        return self.path


def read_profile(path: str | Path) -> Profile:
    return Profile(str(path), tuple(profile_rows(path)))


def profile_rows(path: str | Path | Profile) -> list[tuple[int, dict[str, str]]]:
    """The profile's rows with their line numbers, once its header is checked (PROFILE_COLUMNS) and each model is on
    one row (a Profile: as read)."""
    if isinstance(path, Profile):
        return list(path.rows)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in PROFILE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ProfileError(f"profile {path}: missing column(s) {', '.join(missing)} (the header must name "
                               f"{','.join(PROFILE_COLUMNS)})")
        rows = [(reader.line_num, row) for row in reader]
    first: dict[str, int] = {}
    for line, row in rows:
        m = row["model"]
        if not m:
            raise ProfileError(f"profile {path}: line {line}: a row needs a model")
        if m in first:  # which row counts would be a guess
            raise ProfileError(f"profile {path}: line {line}: model {m!r} is also on line {first[m]}; give each "
                               "model one row")
        first[m] = line
    return rows


def profile_size(path: str | Path | Profile, line: int, row: dict[str, str]) -> int:
    """A profile row's size_bytes: a whole number of bytes, at least 1 and below 2**63 (an int64, as the simulator
    keeps sizes; a size of 0 would divide by zero in every value per byte)."""
    x = profile_number(path, line, row, "size_bytes")
    if not 1 <= x < 2**63:
        raise ProfileError(f"profile {path}: line {line}: model {row.get('model')!r}: size_bytes "
                           f"{(row.get('size_bytes') or '').strip()!r} is not a size from 1 byte to 8 EiB")
    return int(x)


def profile_number(path: str | Path | Profile, line: int, row: dict[str, str], column: str) -> float:
    """One number of a profile row: finite and at least 0."""
    text = (row.get(column) or "").strip()
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not 0 <= x < math.inf:
        raise ProfileError(f"profile {path}: line {line}: model {row.get('model')!r}: {column} {text!r} is not a "
                           "number of 0 or more")
    return x


def load_profile(path: str | Path | Profile | None, models: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Sizes (int64 bytes) and load seconds (float64) per model index (ProfileError: a row that says neither)."""
    prof: dict[str, tuple[int, float]] = {}
    if path is not None:
        for line, row in profile_rows(path):
            prof[row["model"]] = (profile_size(path, line, row), profile_number(path, line, row, "load_seconds"))
    sizes = np.zeros(len(models), dtype=np.int64)
    loads = np.zeros(len(models), dtype=np.float64)
    for i, m in enumerate(models):
        if m in prof:
            sizes[i], loads[i] = prof[m]
        else:
            sizes[i] = default_size(m)
            loads[i] = default_load_seconds(int(sizes[i]))
    return sizes, loads




def load_profile_fields(path: str | Path | Profile | None,
                        models: list[str]) -> tuple[list[int], list[float | None]]:
    """The catalog fields a profile may carry besides size and load time, per model index: `priority`
    (high | normal | low, as its rank; default normal) and `max_replica_age` (seconds, or with s/m/h;
    empty: none). The bundled profiles have neither: every model is normal with no age limit."""
    prio = [1] * len(models)
    ages: list[float | None] = [None] * len(models)
    if path is None:
        return prio, ages
    index = {m: i for i, m in enumerate(models)}
    for line, row in profile_rows(path):
        i = index.get(row["model"])
        if i is None:
            continue
        p = (row.get("priority") or "").strip() or priorities.DEFAULT
        try:  # the catalog's levels and ranks (prewarm.priority)
            prio[i] = priorities.rank(priorities.check(p, f"profile {path}: line {line}: model {row['model']!r}"))
        except ValueError as e:
            raise ProfileError(str(e)) from None
        a = (row.get("max_replica_age") or "").strip()
        if a:  # read as the catalog reads it: the same units and bounds
            try:
                age = parse_duration(a)
            except ValueError:
                age = math.nan  # refused below, with the bounds
            if not in_bounds(age, AGE):
                raise ProfileError(f"profile {path}: line {line}: model {row['model']!r}: max_replica_age {a!r} is "
                                   f"not a duration such as 90s, 30m or 6h, from {AGE.low:g} s to "
                                   f"{AGE.high / 86400:g} days")
            ages[i] = age
    return prio, ages
