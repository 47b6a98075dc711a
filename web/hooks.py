"""Hooks for the request router: report requests, look up where a model is warm, announce a rollout.

    POST /hooks/requests   {"model", "count"=1, "ts"?} or {"events": [...]} (<= 10,000)
                           -> 202 {"accepted": <events>, "requests": <sum of counts>}; all-or-nothing
    GET  /hooks/route?model=<id>[&version=<v>][&retry=1][&priority=high|normal|low]
                           -> 200 {"model", "version", "state": ready|loading|cold, "replicas": [...],
                                   "preload"?: {"queued", "gpu", "message"}}   ready replicas first
                           loading/cold also: "eta_seconds" (and a Retry-After header), and "fallback":
                           {"model", "version", "replicas": [ready ones]} when the catalog names one
                           (prewarm.services.routing, the lookup itself)
                           priority: this lookup's on-demand preload waits for a load slot at that
                           priority instead of the model's catalog one (400 on another value)
                           retry=1: a repeat lookup while waiting for a cold model; not counted again in
                           prewarm_route_lookups_total (which counts requests, not polls); true/yes in any
                           case too, 0/false/no a request, another value a 400
                           a new cold episode also PUBLISHes <model>@<version> on keys.WAKE: the leader
                           scheduler plans at once (e.g. makes room) instead of at its next tick
    POST /hooks/rollout    {"model", "version", "traffic_fraction"} -> 202; the scheduler warms it
"""

from __future__ import annotations

import time

from flask import Blueprint, Response, jsonify, request
from flask.typing import ResponseReturnValue
from pydantic import ValidationError

from prewarm import events, traffic
from prewarm import priority as priorities
from prewarm.catalog_entries import ModelEntry
from prewarm.services import routing
from prewarm.store import overlays
from web import hook_events, hook_wsgi, metrics
from web.auth import require_hook_token
from web.schemas import MAX_BATCH, REQUEST_BATCH, RequestEvent, Rollout, describe
from web.util import ApiError, ctx, json_body, validate

bp = Blueprint("hooks", __name__, url_prefix="/hooks")

@bp.post("/requests")
@require_hook_token
def requests_hook() -> ResponseReturnValue:
    # Most bodies were answered before Flask (web.hook_wsgi); a write it tried and Redis refused is answered here.
    if (failed := request.environ.get(hook_wsgi.FAILED)) is not None:
        raise failed
    data = json_body()
    now = time.time()
    # plainly valid, known models: no pydantic (web.hook_events; a chunked body, say, comes this way)
    if (body := hook_events.accept(data, ctx(), now)) is not None:
        return _accepted(body)
    # Anything else is validated in full, so every refusal names its field as it always has.
    if isinstance(data, dict) and "events" in data:
        if isinstance(data["events"], list) and len(data["events"]) > MAX_BATCH:
            raise ApiError(413, f"events: a batch holds at most {MAX_BATCH} events, "
                                f"got {len(data['events'])}", "events")
        try:
            batch = REQUEST_BATCH.validate_python(data)["events"]
        except ValidationError as exc:
            field, message = describe(exc)
            raise ApiError(422, message, field) from None
        evs = [(ev["model"], ev.get("count", 1), ev.get("ts")) for ev in batch]
        prefix = "events[{}]."
    else:
        one = validate(RequestEvent, data)
        evs = [(one.model, one.count, one.ts)]
        prefix = ""
    catalog = ctx().catalog
    unknown = {m for m, _, _ in evs if m not in catalog}  # each distinct id looked up once
    if unknown:
        i = next(i for i, (m, _, _) in enumerate(evs) if m in unknown)
        field = prefix.format(i) + "model"
        raise ApiError(422, f"{field}: unknown model {evs[i][0]!r}", field)
    recorded = traffic.record(ctx().r, evs, now)
    return _accepted(hook_events.accepted_body(len(evs), recorded))


def _accepted(body: bytes) -> Response:
    return Response(body, 202, mimetype="application/json")


def _model_arg() -> tuple[ModelEntry, str | None]:
    model = request.args.get("model", "")
    version = request.args.get("version") or None
    if not model:
        raise ApiError(400, "model: query parameter is required", "model")
    if len(model) > 128 or (version is not None and len(version) > 128):
        raise ApiError(400, "model: too long", "model")
    catalog = ctx().catalog
    if model not in catalog:
        raise ApiError(404, f"model: unknown model {model!r}", "model")
    try:
        return catalog.get(model, version), version
    except KeyError:
        raise ApiError(404, f"version: unknown version {version!r} of {model!r}", "version") from None


class _Counters:
    """The route lookup's counts, in this web process's Prometheus counters."""

    def lookup(self, answer: str) -> None:
        metrics.ROUTE_LOOKUPS.labels(answer).inc()

    def cold_start(self, model: str) -> None:
        metrics.COLD_STARTS.labels(model).inc()

    def fallback_offer(self, model: str, fallback: str) -> None:
        metrics.FALLBACK_OFFERS.labels(model, fallback).inc()


_COUNTERS = _Counters()


@bp.get("/route")
@require_hook_token
def route_hook() -> ResponseReturnValue:
    entry, _ = _model_arg()
    # One lookup per request: a router re-asking while it waits for a cold model passes retry=1, so the
    # hit rate and cold-start share count requests, not polls.
    answer = routing.lookup(ctx(), entry, priority=_priority_arg(entry), counted=not _retry_arg(),
                            counters=_COUNTERS)
    return jsonify(answer.body), 200, answer.headers


_RETRY = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False, "": False}


def _retry_arg() -> bool:
    """The lookup's `retry` flag, in any case: a Python router's `params={"retry": True}` sends "True", which
    must not count its poll as another request; a value that is neither is refused, not read as a request."""
    raw = request.args.get("retry")
    if raw is None:
        return False
    flag = _RETRY.get(raw.strip().lower())
    if flag is None:
        raise ApiError(400, f"retry: {raw!r} is not a flag; pass retry=1 (or true) on a router's repeat lookup "
                            "while it waits for a cold model, retry=0 (or leave it out) on a request", "retry")
    return flag


def _priority_arg(entry: ModelEntry) -> str:
    """The lookup's `priority` parameter, else the model's catalog priority."""
    raw = request.args.get("priority")
    if raw is None:
        return entry.priority
    try:
        return priorities.check(raw, "priority")
    except ValueError as exc:
        raise ApiError(400, str(exc), "priority") from None


@bp.post("/rollout")
@require_hook_token
def rollout_hook() -> ResponseReturnValue:
    body = validate(Rollout, json_body())
    catalog = ctx().catalog
    if body.model not in catalog:
        raise ApiError(422, f"model: unknown model {body.model!r}", "model")
    try:
        catalog.get(body.model, body.version)
    except KeyError:
        raise ApiError(422, f"version: {body.model}@{body.version} is not in the catalog; add it first",
                       "version") from None
    current = catalog.get(body.model)
    rollout = overlays.Rollout(version=body.version, traffic_fraction=body.traffic_fraction, since=time.time(),
                               from_version=current.version)
    r = ctx().r
    pipe = r.pipeline(transaction=True)
    overlays.announce(pipe, body.model, rollout)
    events.record(pipe, "rollout", "router", model=body.model,
                  reason=f"rollout announced: {body.model}@{body.version} to take "
                         f"{body.traffic_fraction:.0%} of traffic from {current.version}",
                  numbers={"version": body.version, "traffic_fraction": body.traffic_fraction},
                  maxlen=ctx().settings.event_log_max)
    pipe.execute()
    return jsonify({"model": body.model, **rollout.public()}), 202

