"""`POST /hooks/requests` answered before Flask when the request is plainly fine: WSGI middleware.

A router posts a request event for every request it serves, so this hook is the web's hottest path. When the
request has a Content-Length (not chunked) within the body limit, a JSON content type, the hook token if one
is set (from a client this process does not remember as throttled: `web.throttle`), and a body
`web.hook_events.counts` takes whole (well-formed JSON, known models, sane values), it is recorded and
answered 202 here, with the headers every answer carries (`web.util.SECURITY_HEADERS`). Anything
else goes on to Flask untouched (the body put back for it to read), so every refusal keeps its status, field
and words from one place: the Flask view. A Redis error while recording goes on to the view too, carried in
the environ, and the view raises it, so the 503 is the app's own; nothing was recorded (one Lua call, all or
nothing) and the write is not tried twice.

Why: Flask's request context, routing, hooks and response object cost more than the hook's own work; a
single event answered here costs about what `GET /healthz` costs through Flask (docs/web.md).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from prewarm.context import Context
from web import hook_events
from web.auth import hook_token_passes
from web.util import SECURITY_HEADERS

PATH = "/hooks/requests"
FAILED = "prewarm.hook_write_error"  # environ key: the Redis error of a write tried here, for the view to raise

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict, StartResponse], Iterable[bytes]]


class HookFastPath:
    def __init__(self, app: WSGIApp, context: Context, max_body_bytes: int) -> None:
        self.app = app
        self.context = context
        self.max_body_bytes = max_body_bytes

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == PATH and environ.get("REQUEST_METHOD") == "POST":
            body = self._answer(environ)
            if body is not None:
                start_response("202 ACCEPTED", [("Content-Type", "application/json"),
                                                ("Content-Length", str(len(body))), *SECURITY_HEADERS])
                return [body]
        return self.app(environ, start_response)

    def _answer(self, environ: dict) -> bytes | None:
        """The 202 body, or None: Flask answers."""
        if environ.get("CONTENT_TYPE", "").partition(";")[0].strip().lower() != "application/json":
            return None
        length = environ.get("CONTENT_LENGTH", "")
        if not length.isdigit() or not 0 < int(length) <= self.max_body_bytes:
            return None  # none (chunked), empty or over the limit: the view's and werkzeug's rules
        if not hook_token_passes(self.context, environ.get("HTTP_AUTHORIZATION", ""), environ.get("REMOTE_ADDR")):
            return None  # a wrong token, or a client this process saw throttled: the view's 401 or 429
        raw = environ["wsgi.input"].read(int(length))
        environ["wsgi.input"] = io.BytesIO(raw)  # read once: put back for Flask if it answers
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        try:
            return hook_events.accept(data, self.context, time.time())
        except redis.RedisError as exc:
            environ[FAILED] = exc
            return None
