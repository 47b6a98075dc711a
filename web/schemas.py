"""Request payloads of the hooks and the JSON API, validated with pydantic.

Validation errors become a 4xx whose message names the field (`events[3].count: ...`), never a stack
trace; see `web.errors`. Checks that need the catalog (is this a known model?) are done by the views.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any, ClassVar, NotRequired

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
    ValidationError,
    with_config,
)
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

MAX_BATCH = 10_000
FUTURE_SKEW_S = 300.0  # a router's clock may run a little ahead of ours; more than this is a bug
MAX_AGE_S = 8 * 24 * 3600.0  # older than the coarse traffic buckets keep: nothing to record it into
ModelId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


def sane_ts(v: Any) -> float | None:
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("must be a number of Unix seconds")
    try:
        v = float(v)
    except OverflowError:  # an integer too large for a float
        raise ValueError("must be a finite number of Unix seconds") from None
    if not math.isfinite(v):
        raise ValueError("must be a finite number of Unix seconds")
    now = time.time()
    if v > now + FUTURE_SKEW_S:
        raise ValueError(f"is {v - now:.0f} s in the future (at most {FUTURE_SKEW_S:.0f} s allowed)")
    if v < now - MAX_AGE_S:
        raise ValueError("is older than the traffic store keeps (8 days)")
    return float(v)


# The rules for one event's fields, used by both shapes below.
EVENT_COUNT_MAX = 1_000_000
EventCount = Annotated[StrictInt, Field(ge=0, le=EVENT_COUNT_MAX)]
EventTs = Annotated[float | None, BeforeValidator(sane_ts)]


class RequestEvent(_Strict):
    # what /hooks/requests expects, for the answer to a body that is no object (it takes a batch too)
    body_hint: ClassVar[str] = '{"model", "count"?, "ts"?} or {"events": [...]}'

    model: ModelId
    count: EventCount = 1
    ts: EventTs = None


class RequestBatch(_Strict):
    events: Annotated[list[RequestEvent], Field(min_length=1, max_length=MAX_BATCH)]


# The same batch validated into plain dicts: pydantic builds no model instance per event, which made a
# batch of 1,000 cost 2.5 ms of the hook's time instead of 0.5 ms. RequestBatch stays the published
# schema (openapi.json); tests/test_hooks.py checks that both accept and refuse alike.
@with_config(ConfigDict(extra="forbid"))
class _EventDict(TypedDict):
    model: ModelId
    count: NotRequired[EventCount]
    ts: NotRequired[EventTs]


@with_config(ConfigDict(extra="forbid"))
class _BatchDict(TypedDict):
    events: Annotated[list[_EventDict], Field(min_length=1, max_length=MAX_BATCH)]


REQUEST_BATCH = TypeAdapter(_BatchDict)


class Rollout(_Strict):
    model: ModelId
    version: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    traffic_fraction: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class PreloadBody(_Strict):
    gpu: Annotated[str, Field(max_length=200)] | None = None
    version: Annotated[str, Field(max_length=128)] | None = None
    reason: Annotated[str, Field(max_length=500)] | None = None


class EvictBody(PreloadBody):
    pass


def expected_body(model: type[BaseModel]) -> str:
    """The object a view expects, for error messages: '{"model", "version", "traffic_fraction"}'
    (optional fields marked with ?), or the model's own `body_hint`."""
    hint = getattr(model, "body_hint", None)
    if isinstance(hint, str):
        return hint
    names = [f'"{name}"' + ("" if f.is_required() else "?") for name, f in model.model_fields.items()]
    return "{" + ", ".join(names) + "}"


def field_path(loc: tuple[Any, ...]) -> str:
    """('events', 3, 'count') -> 'events[3].count'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def describe(exc: ValidationError) -> tuple[str, str]:
    """The first error as (field, message), e.g. ('events[3].count', 'events[3].count: input ...')."""
    err = exc.errors(include_url=False)[0]
    name = field_path(tuple(err["loc"]))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    return name, f"{name}: {msg}"
