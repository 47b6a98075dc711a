"""The JSON API behind the console.

    GET  /healthz                      {"status": "ok"} (503 while Redis is down)
    GET  /api/fleet                    every GPU (stale ones flagged alive=false; late ones, given no new
                                       loads, fresh=false) with replicas and memory (a
                                       loading replica with eta_seconds, each with last_decision), nodes'
                                       host caches, by_node (the console's grouping), slo (the SLO's state)
    GET  /api/models[?window=60]       every catalog model: requests_total, rate_per_s, replicas, pinned,
                                       min_replicas, cold starts, p95 load time, sparkline (last hour)
    GET  /api/events[?model&gpu&actor&kind&limit]   the decision log, newest first
    GET  /api/roi[?window=3600]        per model: GPU memory-time (GiB·h), warm hits, cold starts, cold starts
                                       avoided, cost at PREWARM_GPU_HOUR_COST (prewarm.roi)
    GET  /api/eta[?limit=50]           how the route hook's ETA promises held: the last 1,000 closed promises'
                                       real − promised median / p95 (exact; the histogram only bounds them)
    POST /api/models/<id>/preload      {"gpu"?, "version"?, "reason"?}  -> 202 queued / 409 / 422
    POST /api/models/<id>/evict        {"gpu"?, "version"?, "reason"?}  -> 202 queued / 409 refused
                                       (an evict of a loading or pending replica cancels its load)
    POST /api/models/<id>/pin | unpin  -> 200
    POST   /api/nodes/<node>/drain     {"reason"?} -> 202 draining (again: 200, unchanged) / 404 unknown node
    DELETE /api/nodes/<node>/drain     -> 200 (the node takes loads again, or was not draining) / 404

Actions go through the one dispatch path (`prewarm.dispatch.Dispatcher`, actor "operator") and land in
the event log. They need the admin bearer token, or a console session plus its CSRF token.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from flask import Blueprint, jsonify, request
from flask.typing import ResponseReturnValue

from prewarm import eta, events, roi, state, traffic
from prewarm.catalog_entries import ModelEntry
from prewarm.domain import states as rs
from prewarm.services import drain, operator
from prewarm.store import cold_starts, eta_promises, load_times, overlays, slo_state
from prewarm.store import policy as running_policy
from web.auth import require_admin
from web.metrics import MEMORY_KINDS, memory_split
from web.schemas import EvictBody, PreloadBody
from web.util import ApiError, ctx, json_body, validate

bp = Blueprint("api", __name__)

SPARK_MINUTES = 60
FORECAST_MINUTES = 10


def trend_forecast(counts: list[int], ahead: int = FORECAST_MINUTES, alpha: float = 0.5,
                   beta: float = 0.3) -> list[float]:
    """Requests per minute for the next `ahead` minutes by Holt's linear smoothing of complete minutes.

    For display beside the sparkline: the scheduler's own forecasts (with the reasons it acts on) are in
    the event log.
    """
    if not any(counts):
        return [0.0] * ahead
    level, trend = float(counts[0]), 0.0
    for x in counts[1:]:
        prev = level
        level = alpha * x + (1 - alpha) * (level + trend)
        trend = beta * (level - prev) + (1 - beta) * trend
    return [round(max(0.0, level + (h + 1) * trend), 3) for h in range(ahead)]


def speculative_share() -> float:
    """Share of each GPU that speculative loads may hold: the same setting the scheduler plans with."""
    return ctx().settings.speculative_share


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    ctx().r.ping()  # a RedisError here becomes the app's 503
    return jsonify({"status": "ok"})


# --- reads ------------------------------------------------------------------------------------------
def fleet_view(now: float | None = None) -> dict[str, Any]:
    c = ctx()
    now = time.time() if now is None else now
    fleet = state.read_fleet(c.r)
    cold_starts.close_ready(c.r, fleet)
    intents = state.read_intents(c.r)
    slo = current_slo(now)
    share = slo["speculative_share"] if slo else speculative_share()
    # each replica's ETA while loading (prewarm.eta: as the route hook promises it) and its last decision
    loading = {x.model for x in fleet.replicas() if x.state in rs.IN_FLIGHT}
    measured = eta.read_measured(c.r, loading) if loading else eta.Measured({}, {})
    last = last_decisions()
    gpus = []
    for g in fleet.gpus:
        d = g.public()
        d["memory"] = memory_split(g) if g.alive else dict.fromkeys(MEMORY_KINDS, 0)
        d["speculative_budget_bytes"] = int(g.total_bytes * share)
        d["heartbeat_age_s"] = round(now - g.last_heartbeat, 1) if g.last_heartbeat else None
        d["intents"] = [{"action": i.action, "model": i.model, "version": i.version, "actor": i.actor,
                         "reason": i.reason} for i in intents if i.gpu == g.id]
        etas = eta.gpu_etas(c.catalog, fleet, g, intents, measured, c.settings.max_loads_per_gpu, now) \
            if g.alive and any(x.model in loading for x in g.replicas) else {}
        for rep in d["replicas"]:
            if (rep["model"], rep["version"]) in etas and rep["state"] in rs.IN_FLIGHT:
                rep["eta_seconds"] = round(etas[(rep["model"], rep["version"])], 1)
            rep["last_decision"] = last.get((rep["model"], g.id))
        gpus.append(d)
    nodes = []  # host caches and staged models (the staging tier), with their in-flight stage/unstage
    for n in fleet.nodes:
        d = n.public()
        d["intents"] = [{"action": i.action, "model": i.model, "version": i.version, "actor": i.actor,
                         "reason": i.reason} for i in intents if i.gpu == state.host_id(n.node)]
        nodes.append(d)
    # the console's grouping: each node's host cache beside its GPUs
    # (and its drain, when it is draining or drained: prewarm.store.drains)
    drain_of = {name: d.public() for name, d in fleet.drain_records.items()}
    by_node = [{"node": name, "host_cache": next((n for n in nodes if n["node"] == name), None),
                "gpus": [g for g in gpus if g["node"] == name], "drain": drain_of.get(name)}
               for name in sorted({g["node"] for g in gpus} | {n["node"] for n in nodes})]
    return {"gpus": gpus, "nodes": nodes, "speculative_share": share, "now": now, "slo": slo, "by_node": by_node,
            "policy": policy_view()}


SLO_FRESH_S = 60.0  # an SLO record the leader has not refreshed for this long is not steering any more


def current_slo(now: float) -> dict[str, Any] | None:
    """The cold-start SLO the leader scheduler steers by, with its figures and budget; None when none is."""
    rec = slo_state.read(ctx().r)
    if rec is None or not isinstance(rec.get("at"), int | float) or now - rec["at"] > SLO_FRESH_S:
        return None
    return rec


def last_decisions(limit: int = 500) -> dict[tuple[str, str], dict[str, Any]]:
    """(model, gpu) -> the newest decision about it among the last `limit` events (one read): who chose to
    load, keep or evict it and why (the worker's own events are outcomes, not decisions)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for ev in events.read(ctx().r, limit=limit):
        if ev.model and ev.gpu and ev.actor != "worker":
            out.setdefault((ev.model, ev.gpu), {"kind": ev.kind, "actor": ev.actor, "reason": ev.reason,
                                                "ts": ev.ts})
    return out


def policy_view() -> dict[str, Any]:
    """The policy the leader scheduler runs (its own record); before any scheduler led, the one this
    process's PREWARM_POLICY names (`source` says which)."""
    c = ctx()
    run = running_policy.running(c.r)
    if run is None:
        return {"name": c.settings.policy, "since": None, "scheduler": None, "source": "settings",
                **dict.fromkeys(running_policy.JUDGEMENTS, "")}
    # what the leader's no-regret layer, loads-ahead, first-request and silence records say at its last tick ("" where
    # it has none)
    return {"name": run.name, "since": run.since, "scheduler": run.scheduler, "source": "scheduler",
            **running_policy.judgement(c.r)}


@bp.get("/api/fleet")
def api_fleet() -> ResponseReturnValue:
    return jsonify(fleet_view())


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]


def models_view(window_s: float = 60.0, now: float | None = None) -> list[dict[str, Any]]:
    c = ctx()
    now = time.time() if now is None else now
    catalog = c.catalog
    ids = catalog.ids()
    fleet = state.read_fleet(c.r)
    cold_starts.close_ready(c.r, fleet)
    rates = traffic.rates(c.r, window_s, now=now)
    minute_end = traffic.bucket_start(now, traffic.MINUTE) + traffic.MINUTE  # include the current minute
    spark = traffic.read_minutes(c.r, minute_end - SPARK_MINUTES * 60, minute_end)
    totals = traffic.totals(c.r)
    last = traffic.last_requests(c.r)
    pinned = overlays.pinned(c.r)
    loads = {m: x.load for m, x in load_times.recent(c.r, ids).items()}
    last_cold = cold_starts.last_durations(c.r)
    open_cold = {m: x.seen_at for m, x in cold_starts.read_open(c.r, now).items()}
    gpus = {g.id: g for g in fleet.gpus}
    out = []
    for m in ids:
        entry = catalog.get(m)
        reps = [{"gpu": x.gpu, "version": x.version, "state": x.state, "progress": round(x.progress, 4),
                 "bytes": x.bytes, "queue": gpus[x.gpu].queue if x.gpu in gpus else ""}
                for x in fleet.replicas(m)]
        out.append({
            "id": m, "version": entry.version, "versions": [v.version for v in catalog.versions(m)],
            "size_bytes": entry.size_bytes, "requests_total": totals.get(m, 0),
            "rate_per_s": round(rates.get(m, 0.0), 4), "rate_window_s": window_s,
            "last_request": last.get(m), "replicas": reps,
            "pinned": entry.pinned or m in pinned, "pinned_in_catalog": entry.pinned,
            "min_replicas": entry.min_replicas, "priority": entry.priority,
            "max_replica_age_s": entry.max_replica_age_s,
            "last_cold_start_s": last_cold.get(m), "cold_start_open_since": open_cold.get(m),
            "p95_load_s": _p95(loads[m]), "load_samples": len(loads[m]),
            "sparkline": {"start": spark.start, "resolution_s": spark.resolution_s,
                          "counts": spark.series(m),  # the last bucket is the current, partial minute
                          "forecast": trend_forecast(spark.series(m)[:-1])},
        })
    return out


@bp.get("/api/models")
def api_models() -> ResponseReturnValue:
    raw = request.args.get("window", "60")
    try:
        window = float(raw)
    except ValueError:
        raise ApiError(400, f"window: {raw!r} is not a number of seconds", "window") from None
    if not 1 <= window <= 7 * 24 * 3600:
        raise ApiError(400, "window: must be between 1 s and 7 days", "window")
    return jsonify({"models": models_view(window), "catalog_problems": catalog_problems()})


def roi_window(raw: str | None) -> int:
    """?window=SECONDS of /api/roi (and the console's ROI page): whole seconds from 60 to a day."""
    raw = "3600" if raw in (None, "") else raw
    try:
        window = int(raw)
    except ValueError:
        raise ApiError(400, f"window: {raw!r} is not a whole number of seconds, e.g. 3600", "window") from None
    if not 60 <= window <= roi.MAX_WINDOW_S:
        raise ApiError(400, f"window: must be between 60 and {roi.MAX_WINDOW_S} seconds (the per-minute "
                            "records are kept a day)", "window")
    return window


def roi_view(window: int) -> dict[str, Any]:
    c = ctx()
    return roi.report(c.r, c.catalog, time.time(), window, c.settings.gpu_hour_cost)


@bp.get("/api/roi")
def api_roi() -> ResponseReturnValue:
    return jsonify(roi_view(roi_window(request.args.get("window"))))


@bp.get("/api/eta")
def api_eta() -> ResponseReturnValue:
    raw = request.args.get("limit", "50")
    if not re.fullmatch(r"[0-9]{1,4}", raw) or int(raw) > eta_promises.KEPT:
        raise ApiError(400, f"limit: must be an integer from 0 to {eta_promises.KEPT}", "limit")
    return jsonify(eta_promises.report(ctx().r, int(raw)))


def catalog_problems() -> dict[str, str]:
    """Catalog entries left out because they are broken (bad weights, bad fields): named, not hidden.
    Web's own lenient load, plus what each live worker refused of its catalog (from its node record):
    a worker may see what web does not (its node's files, its imports). A problem web already names in
    the same words is not repeated; a worker's own is prefixed with its node."""
    c = ctx()
    out = dict(c.catalog.problems)
    for n in state.read_nodes(c.r):
        for name, problem in sorted(n.catalog_problems.items()):
            if out.get(name) == problem:
                continue
            mine = f"node {n.node}: {problem}"
            out[name] = f"{out[name]}; {mine}" if name in out else mine
    return out


@bp.get("/api/events")
def api_events() -> ResponseReturnValue:
    raw = request.args.get("limit", "200")
    if not re.fullmatch(r"[0-9]{1,4}", raw) or not 1 <= int(raw) <= 2000:
        raise ApiError(400, "limit: must be an integer from 1 to 2000", "limit")
    filters = {k: request.args.get(k) or None for k in ("model", "gpu", "actor", "kind")}
    for k, v in filters.items():
        if v is not None and len(v) > 200:
            raise ApiError(400, f"{k}: too long", k)
    evs = events.read(ctx().r, limit=int(raw), **filters)
    return jsonify({"events": [e.public() for e in evs]})


# --- actions ------------------------------------------------------------------------------------------
def _entry(model: str, version: str | None) -> ModelEntry:
    try:
        return operator.entry(ctx(), model, version)
    except operator.Refused as exc:
        raise _api_error(exc) from None


def _api_error(exc: operator.Refused) -> ApiError:
    return ApiError(exc.status, exc.message, exc.field)


def do_preload(model: str, body: PreloadBody) -> dict[str, Any]:
    entry = _entry(model, body.version)
    try:
        d = operator.preload(ctx(), entry, body.gpu, body.reason or "operator preload from the console")
    except operator.Refused as exc:
        raise _api_error(exc) from None
    return {"queued": True, "task_id": d.task_id, "gpu": d.gpu, "model": entry.id, "version": entry.version,
            "message": d.message}


def do_evict(model: str, body: EvictBody) -> dict[str, Any]:
    entry = _entry(model, body.version)
    try:
        done = operator.evict(ctx(), entry, body.gpu, body.reason or "operator evict from the console")
    except operator.Refused as exc:
        raise _api_error(exc) from None
    sent = [{"gpu": x.gpu.id, "queued": x.sent.sent, "task_id": x.sent.task_id, "message": x.sent.message,
             "cancels": x.sent.held.action if x.sent.superseded and x.sent.held else None} for x in done]
    message = "; ".join(s["message"] for s in sent)
    if not all(s["queued"] for s in sent):
        # Refused (another action on it in flight): say so with a non-2xx, naming what was and was not sent.
        raise ApiError(409, message, "model")
    return {"model": entry.id, "version": entry.version, "evictions": sent, "message": message}


def do_pin(model: str, pin: bool) -> dict[str, Any]:
    c = ctx()
    entry = _entry(model, None)
    overlays.set_pinned(c.r, entry.id, pin)
    word = "pin" if pin else "unpin"
    events.record(c.r, word, "operator", model=entry.id, reason=f"operator {word} from the console",
                  maxlen=c.settings.event_log_max)
    note = " (pinned in the catalog too: it stays pinned)" if not pin and entry.pinned else ""
    return {"model": entry.id, "pinned": pin or entry.pinned, "message": f"{entry.id} {word}ned{note}"}


def _optional_body(model: type[PreloadBody]) -> PreloadBody:
    if not request.get_data(cache=True):
        return model()
    return validate(model, json_body())


@bp.post("/api/models/<model>/preload")
@require_admin
def api_preload(model: str) -> ResponseReturnValue:
    return jsonify(do_preload(model, _optional_body(PreloadBody))), 202


@bp.post("/api/models/<model>/evict")
@require_admin
def api_evict(model: str) -> ResponseReturnValue:
    return jsonify(do_evict(model, _optional_body(EvictBody))), 202


@bp.post("/api/models/<model>/pin")
@require_admin
def api_pin(model: str) -> ResponseReturnValue:
    return jsonify(do_pin(model, True))


@bp.post("/api/models/<model>/unpin")
@require_admin
def api_unpin(model: str) -> ResponseReturnValue:
    return jsonify(do_pin(model, False))


def _drain_reason(default: str) -> str:
    if not request.get_data(cache=True):
        return default
    body = json_body()
    reason = body.get("reason") if isinstance(body, dict) else None
    if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
        raise ApiError(422, "reason: write a string of at most 500 characters", "reason")
    return reason or default


@bp.post("/api/nodes/<node>/drain")
@require_admin
def api_drain(node: str) -> ResponseReturnValue:
    c = ctx()
    try:
        begun = drain.begin(c.r, node, actor="operator", reason=_drain_reason("operator drain from the console"),
                            grace_s=c.settings.drain_grace, maxlen=c.settings.event_log_max)
    except drain.UnknownNode as exc:
        raise ApiError(404, exc.message, "node") from None
    return jsonify(begun.public()), 202 if begun.new else 200


@bp.delete("/api/nodes/<node>/drain")
@require_admin
def api_undrain(node: str) -> ResponseReturnValue:
    c = ctx()
    try:
        done = drain.end(c.r, node, actor="operator", reason=_drain_reason("operator undrain from the console"),
                         maxlen=c.settings.event_log_max)
    except drain.UnknownNode as exc:
        raise ApiError(404, exc.message, "node") from None
    message = f"{node} takes loads again" if done is not None else f"{node} is not draining: nothing to undo"
    return jsonify({"node": node, "draining": False, "undone": done is not None, "message": message})
