"""Credentials: the hook token for the request router, the admin token for the console and the API.

- Hooks: when PREWARM_HOOK_TOKEN is set, `Authorization: Bearer <token>` is required; wrong tries are
  throttled per client address like the admin token's (`web.throttle`), at no Redis cost to a right one.
- Mutating console and API routes: a console session (logged in with PREWARM_ADMIN_TOKEN) plus a CSRF
  token, or `Authorization: Bearer <PREWARM_ADMIN_TOKEN>` for API clients (no cookie, so no CSRF risk).
  With no admin token configured, every action is refused: there is no way to log in.
- Read-only pages and GET endpoints are open (the console is meant to sit on an operator network; the
  request router also reads /api/models). Nothing secret is shown on them.
- A console session is a server-side record checked on every request (`web.sessions`): /logout ends it,
  and changing the admin token ends them all. Wrong tries of the admin token are throttled (`web.throttle`).

Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import current_app, g, request, session

from prewarm.context import Context
from web import sessions, throttle
from web.util import ApiError, ctx

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"


def _bearer_of(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _bearer() -> str | None:
    return _bearer_of(request.headers.get("Authorization", ""))


def _matches(given: str | None, expected: str | None) -> bool:
    return bool(given and expected and hmac.compare_digest(given.encode(), expected.encode()))


def bearer_matches(authorization: str, expected: str) -> bool:
    """Whether an Authorization header's value carries `Bearer <expected>` (constant time)."""
    return _matches(_bearer_of(authorization), expected)


def hook_token_passes(c: Context, authorization: str, client: str | None) -> bool:
    """The hot path's test: the right hook token (or none configured) from a client this process does not
    remember as throttled; no Redis call. False: `check_hook_token` decides (401 or 429)."""
    expected = c.settings.hook_token
    return not expected or (bearer_matches(authorization, expected)
                            and not throttle.remembered(c, throttle.HOOK, client))


def check_hook_token() -> None:
    c, client = ctx(), request.remote_addr
    if hook_token_passes(c, request.headers.get("Authorization", ""), client):
        return
    given = _bearer()
    if _matches(given, c.settings.hook_token):  # right, from a client remembered as throttled
        throttle.hook_refuse_if_throttled(c, client, "Authorization")
        return
    if given is not None:  # a wrong token is a try; no token at all guesses nothing
        throttle.hook_failed(c, client, "Authorization")
    raise ApiError(401, "Authorization: a valid 'Bearer <PREWARM_HOOK_TOKEN>' header is required",
                   "Authorization")


def require_hook_token(view: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        check_hook_token()
        return view(*args, **kwargs)

    return wrapped


def _admin_token_matches(given: str | None, field: str) -> bool:
    """Compare a try of the admin token, counted by the login throttle (429 when over its limits)."""
    c = ctx()
    tried = throttle.attempt(c, request.remote_addr, field)
    if not _matches(given, c.settings.admin_token):
        throttle.failed(c, tried, field)
        return False
    throttle.succeeded(c, tried)
    return True


def login(token: str) -> bool:
    """Check the token and start a new server-side session (a fresh id and CSRF token: no fixation)."""
    if not ctx().settings.admin_token or not _admin_token_matches(token, "token"):
        return False
    lifetime = int(current_app.permanent_session_lifetime.total_seconds())
    session.clear()
    session.update(sessions.create(ctx(), lifetime, request.remote_addr))
    session[CSRF_FIELD] = secrets.token_urlsafe(24)
    session.permanent = True
    g.pw_logged_in = True
    return True


def logout() -> None:
    sessions.revoke(ctx(), session)
    session.clear()
    g.pw_logged_in = False


def logged_in() -> bool:
    """A live console session (checked against Redis once per request; a dead one is dropped from the cookie)."""
    if "pw_logged_in" not in g:
        sessions.require_store()
        live = bool(ctx().settings.admin_token) and "sid" in session and sessions.is_live(ctx(), session)
        if not live and "sid" in session:
            for name in ("sid", "fp"):  # logged out elsewhere, or the admin token changed
                session.pop(name, None)
        g.pw_logged_in = live
    return bool(g.pw_logged_in)


def csrf_token() -> str:
    """The session's CSRF token (created on first use, also for the login form)."""
    tok = session.get(CSRF_FIELD)
    if not tok:
        tok = session[CSRF_FIELD] = secrets.token_urlsafe(24)
    return tok


def check_csrf() -> None:
    sessions.require_store()  # Redis down: a 503, not "wrong CSRF token"
    given = request.headers.get(CSRF_HEADER) or request.form.get(CSRF_FIELD)
    if not _matches(given, session.get(CSRF_FIELD)):
        raise ApiError(403, f"{CSRF_FIELD}: missing or wrong CSRF token; reload the page", CSRF_FIELD)


def check_admin() -> str:
    """Admin credentials for a mutating request; returns how they were given ('bearer' or 'session')."""
    admin = ctx().settings.admin_token
    if not admin:
        raise ApiError(403, "actions are disabled: set PREWARM_ADMIN_TOKEN to enable them", "Authorization")
    if _bearer() is not None:
        if _admin_token_matches(_bearer(), "Authorization"):
            return "bearer"
        raise ApiError(401, "Authorization: the bearer token is not the admin token", "Authorization")
    if logged_in():
        check_csrf()
        return "session"
    raise ApiError(401, "Authorization: log in to the console or send 'Bearer <PREWARM_ADMIN_TOKEN>'",
                   "Authorization")


def require_admin(view: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        check_admin()
        return view(*args, **kwargs)

    return wrapped
