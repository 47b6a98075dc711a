"""The fast path of `POST /hooks/requests`: accept a well-formed body for known models without pydantic.

`counts(data, catalog, now)` returns the body's requests aggregated per (timestamp, model), ready for
`prewarm.traffic.record_counts`, when every event is plainly valid: a dict of `model` (a catalog id),
`count` (an int, 0..1,000,000) and `ts` (None, or Unix seconds `web.schemas` accepts) and nothing else.
For anything else it returns None and the hook validates with pydantic as before, so every refusal keeps
its exact status, field and words. It is accept-only: whatever it accepts, `web.schemas` accepts with
the same values (tests/system/test_hooks.py checks both agree), and a catalog id always matches the
schema's id pattern (`prewarm.catalog` refuses any other).

Why: pydantic plus the per-event tuples and the catalog check were most of the hook's own cost; here a
single event is a few dict lookups, and a batch costs one set lookup per event, with each distinct
timestamp checked once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis

from prewarm import traffic
from prewarm.catalog_entries import Catalog, CatalogError
from prewarm.context import Context
from web import group_commit
from web.schemas import EVENT_COUNT_MAX, MAX_BATCH, sane_ts

_FIELDS = frozenset(("model", "count", "ts"))
_known: tuple[Catalog | None, frozenset[str]] = (None, frozenset())


def known_ids(catalog: Catalog) -> frozenset[str]:
    """The catalog's ids as a set, made once per catalog object (the context replaces the object when the
    file changes, so identity is the version check)."""
    global _known
    cached_for, ids = _known
    if cached_for is not catalog:
        ids = frozenset(catalog.ids())
        _known = (catalog, ids)  # one tuple assignment: threads see the old pair or the new one
    return ids


def counts(data: Any, catalog: Catalog, now: float) -> tuple[dict[float, dict[str, int]], int] | None:
    """({ts: {model: requests}}, number of events), or None when the body needs full validation."""
    if type(data) is not dict:
        return None
    ids = known_ids(catalog)
    if "events" not in data:
        events: Any = (data,)
    elif len(data) == 1 and type(events := data["events"]) is list and 0 < len(events) <= MAX_BATCH:
        pass
    else:
        return None
    try:
        # The common shape first, counted in C: {"model": <id>} alone. A list, a string or a number in
        # place of an event, or a one-key dict without "model", raises here; a model that is no catalog
        # id (an unhashable one raises too) fails issuperset.
        plain = [ev["model"] for ev in events if len(ev) == 1]
        if not ids.issuperset(plain):
            return None
    except (TypeError, KeyError):
        return None
    out: dict[float, dict[str, int]] = {now: Counter(plain)} if plain else {}
    if len(plain) == len(events):
        return out, len(events)
    ts_ok: dict[int | float, float] = {}  # each distinct timestamp checked once
    for ev in events:
        if len(ev) == 1:
            continue
        if type(ev) is not dict or len(ev) > 3 or not _FIELDS.issuperset(ev):
            return None
        model = ev.get("model")
        if type(model) is not str or model not in ids:
            return None
        count = ev.get("count", 1)
        if type(count) is not int or not 0 <= count <= EVENT_COUNT_MAX:
            return None
        raw = ev.get("ts")
        if raw is None:
            ts = now
        elif type(raw) is int or type(raw) is float:
            got = ts_ok.get(raw)
            if got is None:
                try:
                    got = ts_ok[raw] = float(sane_ts(raw))  # type: ignore[arg-type]
                except (ValueError, TypeError):
                    return None
            ts = got
        else:
            return None
        per_model = out.get(ts)
        if per_model is None:
            per_model = out[ts] = {}
        per_model[model] = per_model.get(model, 0) + count
    return out, len(events)


def record(r: redis.Redis, fast: tuple[dict[float, dict[str, int]], int], now: float) -> int:
    """Record what `counts` returned; the number of requests recorded. One event goes straight to Redis;
    a batch shares a write with the batches in flight beside it (web.group_commit: merged, single events
    cost more in thread hand-offs than the round trip they save)."""
    if fast[1] == 1:
        return traffic.record_counts(r, fast[0], now)
    return group_commit.for_client(r, traffic.record_counts).record(fast[0], now)


def accept(data: Any, context: Context, now: float) -> bytes | None:
    """The whole fast path, for the middleware (web.hook_wsgi) and the view alike: record a plainly valid
    body and return its 202 body, or None (nothing recorded) when the body needs full validation or the
    catalog cannot be read (the view answers that after the body's own checks). Redis errors propagate."""
    try:
        fast = counts(data, context.catalog, now)
    except CatalogError:
        return None
    if fast is None:
        return None
    return accepted_body(fast[1], record(context.r, fast, now))


def accepted_body(events: int, requests: int) -> bytes:
    """The 202 body, `{"accepted", "requests"}`: what jsonify writes for it, without its encoder."""
    return f'{{"accepted":{events},"requests":{requests}}}\n'.encode()
