"""The Flask app: hooks for the request router, JSON API, admin console, /metrics.

`create_app(context=None)` builds it around a `prewarm.context.Context` (settings, Redis, Celery,
catalog, dispatcher); gunicorn serves `web.app:create_app()`.

Errors are always answered in words: a client error names the field at fault, Redis being down is a 503
saying so, and anything unexpected is a 500 with no stack trace (the trace goes to the server log).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import redis
from flask import Flask, Response, jsonify, render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from prewarm.catalog_entries import CatalogError
from prewarm.context import Context
from web import api, console, hooks, metrics, openapi, sessions
from web.hook_wsgi import HookFastPath
from web.util import SECURITY_HEADERS, ApiError, ctx, enforce_body_limit, json_error

log = logging.getLogger("prewarm.web")
MAX_BODY_BYTES = 8 * 1024 * 1024  # a full batch of 10,000 events is well under 1 MiB


def _wants_json() -> bool:
    return request.path.startswith(("/hooks", "/api", "/healthz", "/metrics", "/openapi")) \
        or request.accept_mimetypes.best == "application/json"


def create_app(context: Context | None = None) -> Flask:
    app = Flask(__name__)
    c = context or Context(start_redis=False)
    app.extensions["prewarm"] = c
    app.session_interface = sessions.RedisKeyedSessions()  # signed with a random key, not the admin token
    app.config.update(
        MAX_CONTENT_LENGTH=MAX_BODY_BYTES,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",  # no cookie on cross-site posts; forms also carry a CSRF token
        SESSION_COOKIE_NAME="prewarm_session",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=12),
        JSON_SORT_KEYS=False,
    )
    app.json.sort_keys = False  # type: ignore[attr-defined]
    try:  # zero series per catalog model, so rate() and the docs' queries work before the first cold start
        for model_id in c.catalog.ids():
            metrics.COLD_STARTS.labels(model_id)
    except (CatalogError, OSError) as exc:
        log.error("catalog cannot be loaded: %s", exc)  # requests that need it will answer 503
    app.before_request(enforce_body_limit)
    app.register_blueprint(hooks.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(console.bp)
    app.register_blueprint(openapi.bp)

    @app.get("/metrics")
    def metrics_view() -> Response:
        # Read only: cold starts are closed and loads recorded where they happen (the worker's ready).
        return Response(metrics.exposition(ctx().r), mimetype="text/plain; version=0.0.4; charset=utf-8")

    @app.errorhandler(ApiError)
    def api_error(exc: ApiError) -> ResponseReturnValue:
        headers = dict(exc.headers)
        if not _wants_json():
            return render_template("error.html", status=exc.status, message=exc.message), exc.status, headers
        if exc.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="prewarm"'
        return json_error(exc.status, exc.message, exc.field, headers)

    @app.errorhandler(redis.RedisError)
    def redis_down(exc: redis.RedisError) -> ResponseReturnValue:
        log.warning("Redis unavailable: %s", exc.__class__.__name__)
        message = "Redis is unavailable; prewarm's state cannot be read or written right now. Retry shortly."
        if not _wants_json():
            return render_template("error.html", status=503, message=message), 503, {"Retry-After": "2"}
        return json_error(503, message, headers={"Retry-After": "2"})

    @app.errorhandler(CatalogError)
    def catalog_broken(exc: CatalogError) -> ResponseReturnValue:
        log.error("catalog cannot be loaded: %s", exc)
        return json_error(503, f"the model catalog cannot be loaded: {exc}")

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> ResponseReturnValue:
        code = exc.code or 500
        message = {413: f"body: larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB",
                   404: f"{request.path}: no such page", 405: f"{request.method} is not allowed on "
                   f"{request.path}"}.get(code, exc.description or exc.name)
        if not _wants_json():
            return render_template("error.html", status=code, message=message), code
        resp = jsonify({"error": message})
        resp.status_code = code
        if code == 405 and exc.get_response().headers.get("Allow"):
            resp.headers["Allow"] = exc.get_response().headers["Allow"]
        return resp

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> ResponseReturnValue:
        log.exception("unhandled error on %s %s", request.method, request.path)
        if not _wants_json():
            return render_template("error.html", status=500, message="internal error (see the server log)"), 500
        return json_error(500, "internal error; the server log has the details")

    @app.after_request
    def security_headers(resp: Response) -> Response:
        for name, value in SECURITY_HEADERS:
            resp.headers.setdefault(name, value)
        if resp.mimetype == "text/html":
            resp.headers.setdefault("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
                                    "style-src 'self' 'unsafe-inline'; script-src 'self'; frame-ancestors 'none'")
        return resp

    app.wsgi_app = HookFastPath(app.wsgi_app, c, MAX_BODY_BYTES)  # type: ignore[method-assign]
    return app
