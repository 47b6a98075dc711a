"""Hooks for the request router: report requests, look up where a model is warm, announce a rollout.

    POST /hooks/requests   {"model", "count"=1, "ts"?} or {"events": [...]} (<= 10,000)
                           -> 202 {"accepted": <events>, "requests": <sum of counts>}; all-or-nothing
    GET  /hooks/route?model=<id>[&version=<v>][&retry=1][&priority=high|normal|low]
                           -> 200 {"model", "version", "state": ready|loading|cold, "replicas": [...],
                                   "preload"?: {"queued", "gpu", "message"}}   ready replicas first
                           loading/cold also: "eta_seconds" (and a Retry-After header), and "fallback":
                           {"model", "version", "replicas": [ready ones]} when the catalog names one
                           (web.cold_answer)
                           priority: this lookup's on-demand preload waits for a load slot at that
                           priority instead of the model's catalog one (400 on another value)
                           retry=1: a repeat lookup while waiting for a cold model; not counted again in
                           prewarm_route_lookups_total (which counts requests, not polls)
                           a new cold episode also PUBLISHes <model>@<version> on keys.WAKE: the leader
                           scheduler plans at once (e.g. makes room) instead of at its next tick
    POST /hooks/rollout    {"model", "version", "traffic_fraction"} -> 202; the scheduler warms it
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from flask import Blueprint, Response, jsonify, request
from flask.typing import ResponseReturnValue
from pydantic import ValidationError

from prewarm import events, keys, replica_states, rooms, state, traffic
from prewarm import priority as priorities
from prewarm.catalog import ModelEntry
from prewarm.config import format_bytes
from prewarm.store import cold_starts, overlays
from web import cold_answer, coldstarts, hook_events, hook_wsgi, metrics
from web.auth import require_hook_token
from web.schemas import MAX_BATCH, REQUEST_BATCH, RequestEvent, Rollout, describe
from web.util import ApiError, ctx, json_body, validate

log = logging.getLogger(__name__)

bp = Blueprint("hooks", __name__, url_prefix="/hooks")

# Routable replica states, best first: a router sends to `ready`; the others say when it will be.
_ORDER = {name: i for i, name in enumerate(replica_states.ROUTABLE)}


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


def replica_view(rep: state.Replica, gpu: state.Gpu) -> dict[str, Any]:
    # endpoint: where a router sends requests itself (an engine's OpenAI base URL); None: through `infer`.
    return {"gpu": gpu.id, "queue": gpu.queue, "version": rep.version, "state": rep.state,
            "progress": round(rep.progress, 4), "in_flight": rep.in_flight, "endpoint": rep.endpoint}


@bp.get("/route")
@require_hook_token
def route_hook() -> ResponseReturnValue:
    entry, _ = _model_arg()
    priority = _priority_arg(entry)
    c = ctx()
    fleet = state.read_fleet(c.r, include_stale=False)
    found = [(rep, g) for g in fleet.alive() for rep in g.replicas
             if rep.model == entry.id and rep.version == entry.version and rep.state in _ORDER]
    # Ready first; among ready, the least busy; then the furthest along.
    found.sort(key=lambda p: (_ORDER[p[0].state], p[0].in_flight, -p[0].progress, p[1].id))
    body: dict[str, Any] = {"model": entry.id, "version": entry.version,
                            "replicas": [replica_view(rep, g) for rep, g in found]}
    if found and found[0][0].state == replica_states.READY:
        body["state"] = "ready"
        cold_starts.close_ready(c.r, fleet, [entry.id])
    elif found or _preload_in_flight(entry, fleet):
        body["state"] = "loading"
        coldstarts.open_cold_start(c.r, entry.id, entry.version)
    else:
        body["state"] = "cold"
        new_episode = coldstarts.open_cold_start(c.r, entry.id, entry.version)
        body["preload"] = _on_demand_preload(entry, fleet, priority)
        if new_episode:  # once per cold episode (its HSETNX claim), not on every router retry
            _wake_scheduler(entry)
    # One lookup per request: a router re-asking while it waits for a cold model passes retry=1, so the
    # hit rate and cold-start share count requests, not polls.
    counted = request.args.get("retry") not in ("1", "true")
    headers = {} if body["state"] == "ready" else cold_answer.add_fields(body, entry, fleet, counted, replica_view)
    if counted:
        metrics.ROUTE_LOOKUPS.labels(body["state"]).inc()
        cold_answer.count_lookup(body)
    return jsonify(body), 200, headers


def _wake_scheduler(entry: ModelEntry) -> None:
    """Wake the leader scheduler to plan now (e.g. make room by evicting) rather than at its next tick.
    Fire-and-forget: a lost wake-up only costs the wait for that tick, so a failure never fails the hook."""
    try:
        ctx().r.publish(keys.WAKE, entry.key)
    except redis.RedisError as exc:
        log.warning("could not wake the scheduler for %s: %s", entry.key, exc)


def _preload_in_flight(entry: ModelEntry, fleet: state.Fleet) -> bool:
    """A preload already dispatched (by anyone) but not yet visible as a replica."""
    held = state.held_intents(ctx().r, [(entry.id, g.id) for g in fleet.alive()])
    return any(it.action == "preload" and it.version == entry.version for it in held)


def _priority_arg(entry: ModelEntry) -> str:
    """The lookup's `priority` parameter, else the model's catalog priority."""
    raw = request.args.get("priority")
    if raw is None:
        return entry.priority
    try:
        return priorities.check(raw, "priority")
    except ValueError as exc:
        raise ApiError(400, str(exc), "priority") from None


def _on_demand_preload(entry: ModelEntry, fleet: state.Fleet, priority: str) -> dict[str, Any]:
    c = ctx()
    claim = keys.cold_claim(entry.key)
    # One on-demand preload per cold episode, however many routers ask at once.
    if not c.r.set(claim, f"{time.time():.3f}", nx=True, px=int(c.settings.intent_ttl * 1000)):
        return {"queued": False, "message": "an on-demand preload is already in flight"}
    answer: dict[str, Any] = {
        "queued": False, "message": "other on-demand preloads are being placed; the scheduler will place this one"}
    try:
        # One placement at a time: each sees the intents of those before it (a few ms each).
        lock = c.r.lock(keys.ON_DEMAND_LOCK, timeout=5.0, blocking_timeout=2.0)
        if lock.acquire():
            try:
                answer = _place_on_demand(entry, fleet, priority)
            finally:
                try:
                    lock.release()
                except redis.exceptions.LockError:
                    pass  # held past its timeout (a stalled placement): it has expired already
        return answer
    finally:
        if not answer["queued"]:
            c.r.delete(claim)  # nothing sent (or it failed): let the next lookup try again


def _place_on_demand(entry: ModelEntry, fleet: state.Fleet, priority: str) -> dict[str, Any]:
    c = ctx()
    # The placement rule's order (prewarm.rooms.ranked): a node holding a staged copy first (a promotion
    # from host memory, not a storage read), then a free load slot (on a full GPU the preload would queue
    # behind its loads), fewer loads, the tightest fit; a GPU busy with another action on this model
    # (e.g. loading its other version) refuses the intent, so the next one is tried.
    # Only GPUs with a fresh heartbeat are in it: a late one (its worker stopped?) is not a fallback either.
    order = rooms.ranked(c.r, fleet, c.catalog, entry, c.settings.max_loads_per_gpu)
    if not order:
        where = "no GPU in the fleet" if not fleet.alive() else \
            f"no GPU has {format_bytes(entry.size_bytes)} free{rooms.late_note(fleet)}; the scheduler will make room"
        return {"queued": False, "message": where}
    staged = rooms.staged_nodes(fleet, entry)
    for gpu in order:
        d = c.dispatcher.preload(entry.id, entry.version, gpu, actor="router", kind="demand", priority=priority,
                                 reason="route lookup found the model cold: on-demand preload",
                                 numbers={"size_bytes": entry.size_bytes, "free_bytes": gpu.free_bytes,
                                          "staged": gpu.node in staged})
        if d.sent:
            return {"queued": True, "gpu": d.gpu, "message": d.message}
    return {"queued": False, "message": d.message}


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

