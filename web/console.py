"""The admin console: server-rendered Fleet / Models / Events pages, login, and operator actions.

Pages are plain HTML; `static/console.js` re-fetches the page every few seconds and swaps its main
section, so there is no build step and the pages work without JavaScript too. Actions are form posts
with a CSRF token, go through the same functions as the JSON API (and so the one dispatch path), and
redirect back with a flash message.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlparse

import redis
from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from pydantic import ValidationError

from prewarm import events, traffic
from prewarm.units import format_bytes
from web import api, auth
from web.schemas import EvictBody, PreloadBody
from web.util import ApiError, ctx

bp = Blueprint("console", __name__, template_folder="templates", static_folder="static",
               static_url_path="/static")


@bp.app_template_filter("bytes")
def _bytes(n: float | None) -> str:
    return format_bytes(n or 0)


@bp.app_template_filter("ago")
def _ago(ts: float | None) -> str:
    if not ts:
        return "never"
    d = max(0.0, time.time() - ts)
    if d < 60:
        return f"{d:.0f} s ago"
    if d < 3600:
        return f"{d / 60:.0f} min ago"
    if d < 86400:
        return f"{d / 3600:.1f} h ago"
    return f"{d / 86400:.1f} d ago"


@bp.app_template_filter("num")
def _num(v: object) -> str:
    """Decision numbers at a readable precision (4 significant digits for floats)."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


@bp.app_template_filter("clock")
def _clock(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else ""


@bp.app_template_filter("pct")
def _pct(part: float, whole: float) -> str:
    return f"{(100.0 * part / whole) if whole else 0.0:.2f}%"


@bp.app_context_processor
def _globals() -> dict[str, Any]:
    try:
        logged_in = auth.logged_in()
    except redis.RedisError:  # e.g. rendering the "Redis is unavailable" page itself
        logged_in = False
    return {"logged_in": logged_in, "csrf_token": auth.csrf_token,
            "actions_enabled": bool(ctx().settings.admin_token)}


def _sparkline(counts: list[int], forecast: list[float], width: float = 144.0,
               height: float = 24.0) -> tuple[str, str]:
    """SVG polyline points for the last hour and, continuing it, the forecast (scaled to the joint peak)."""
    values = [float(c) for c in counts] + list(forecast)
    if not values:
        return "", ""
    peak = max(values) or 1.0
    step = width / max(1, len(values) - 1)

    def pt(i: int, v: float) -> str:
        return f"{i * step:.1f},{height - (v / peak) * (height - 2) - 1:.1f}"

    past = " ".join(pt(i, v) for i, v in enumerate(values[:len(counts)]))
    ahead = " ".join(pt(i, v) for i, v in enumerate(values) if i >= len(counts) - 1)
    return past, ahead


@bp.get("/")
def index() -> ResponseReturnValue:
    return redirect(url_for("console.fleet"))


@bp.get("/fleet")
def fleet() -> ResponseReturnValue:
    view = api.fleet_view()
    c = ctx()
    now = view["now"]
    rates = traffic.rates(c.r, 60, now=now)
    last = traffic.last_requests(c.r)
    return render_template("fleet.html", view=view, rates=rates, last=last, models=c.catalog.models)


@bp.get("/models")
def models() -> ResponseReturnValue:
    rows = api.models_view()
    for row in rows:
        row["spark_points"], row["forecast_points"] = _sparkline(row["sparkline"]["counts"],
                                                                 row["sparkline"]["forecast"])
        row["spark_peak"] = max(row["sparkline"]["counts"] or [0])
        row["forecast_per_s"] = (row["sparkline"]["forecast"] or [0.0])[-1] / 60.0
    alive = [g for g in api.fleet_view()["gpus"] if g["alive"]]
    return render_template("models.html", rows=rows, gpus=alive)


@bp.get("/events")
def events_page() -> ResponseReturnValue:
    filters = {k: (request.args.get(k) or "").strip()[:200] or None for k in ("model", "gpu", "actor")}
    evs = events.read(ctx().r, limit=300, **filters)
    return render_template("events.html", events=evs, filters=filters, actors=events.ACTORS)


@bp.get("/roi")
def roi_page() -> ResponseReturnValue:
    try:
        window = api.roi_window(request.args.get("window"))
    except ApiError as exc:
        flash(exc.message, "error")
        window = api.roi_window(None)
    return render_template("roi.html", view=api.roi_view(window), windows=ROI_WINDOWS)


ROI_WINDOWS = ((900, "15 min"), (3600, "1 h"), (6 * 3600, "6 h"), (24 * 3600, "24 h"))


@bp.route("/login", methods=["GET", "POST"])
def login() -> ResponseReturnValue:
    nxt = _safe_next(request.values.get("next"))
    if request.method == "POST":
        auth.check_csrf()
        if auth.login(request.form.get("token", "")):
            flash("Logged in.", "ok")
            return redirect(nxt)
        flash("That is not the admin token (PREWARM_ADMIN_TOKEN).", "error")
        return render_template("login.html", next=nxt), 401
    return render_template("login.html", next=nxt)


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    auth.check_csrf()
    auth.logout()
    flash("Logged out.", "ok")
    return redirect(url_for("console.fleet"))


def _safe_next(target: str | None) -> str:
    """Only same-site paths: no open redirect through ?next= or the Referer."""
    if target:
        parsed = urlparse(target)
        if not parsed.scheme and not parsed.netloc and target.startswith("/") and not target.startswith("//"):
            return target
    return url_for("console.fleet")


@bp.post("/actions/preload")
def action_form() -> ResponseReturnValue:
    """The fleet page's per-GPU preload form, where the model is a form field."""
    return action((request.form.get("model") or "")[:128], "preload")


@bp.post("/actions/<model>/<action>")
def action(model: str, action: str) -> ResponseReturnValue:
    back = _safe_next(request.form.get("next"))
    if not auth.logged_in():
        flash("Log in to act on the fleet.", "error")
        return redirect(url_for("console.login", next=back))
    auth.check_csrf()
    form = {k: v for k, v in request.form.items() if k in ("gpu", "version", "reason") and v}
    try:
        if action == "preload":
            result = api.do_preload(model, PreloadBody(**form))
        elif action == "evict":
            result = api.do_evict(model, EvictBody(**form))
        elif action in ("pin", "unpin"):
            result = api.do_pin(model, action == "pin")
        else:
            raise ApiError(404, f"action: unknown action {action!r}", "action")
        flash(result["message"], "ok")
    except ApiError as exc:
        flash(exc.message, "error")
    except ValidationError as exc:
        flash(f"invalid form: {exc.errors(include_url=False)[0]['msg']}", "error")
    return redirect(back)
