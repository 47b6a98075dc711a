"""Credentials: the hook token for the request router, the admin token for the console and the API.

- Hooks: when PREWARM_HOOK_TOKEN is set, `Authorization: Bearer <token>` is required.
- Mutating console and API routes: a console session (logged in with PREWARM_ADMIN_TOKEN) plus a CSRF
  token, or `Authorization: Bearer <PREWARM_ADMIN_TOKEN>` for API clients (no cookie, so no CSRF risk).
  With no admin token configured, every action is refused: there is no way to log in.
- Read-only pages and GET endpoints are open (the console is meant to sit on an operator network; the
  request router also reads /api/models). Nothing secret is shown on them.

Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import request, session

from web.util import ApiError, ctx

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"


def secret_key(admin_token: str | None) -> bytes:
    """The session-signing key: derived from the admin token so every gunicorn worker agrees on it, and
    rotating the token logs everyone out. Random when there is no token (there is no login then)."""
    if not admin_token:
        return secrets.token_bytes(32)
    return hmac.new(admin_token.encode(), b"prewarm console session v1", hashlib.sha256).digest()


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _matches(given: str | None, expected: str | None) -> bool:
    return bool(given and expected and hmac.compare_digest(given.encode(), expected.encode()))


def check_hook_token() -> None:
    expected = ctx().settings.hook_token
    if expected and not _matches(_bearer(), expected):
        raise ApiError(401, "Authorization: a valid 'Bearer <PREWARM_HOOK_TOKEN>' header is required",
                       "Authorization")


def require_hook_token(view: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        check_hook_token()
        return view(*args, **kwargs)

    return wrapped


def login(token: str) -> bool:
    if not _matches(token, ctx().settings.admin_token):
        return False
    session.clear()
    session["admin"] = True
    session[CSRF_FIELD] = secrets.token_urlsafe(24)
    session.permanent = True
    return True


def logged_in() -> bool:
    return bool(session.get("admin")) and bool(ctx().settings.admin_token)


def csrf_token() -> str:
    """The session's CSRF token (created on first use, also for the login form)."""
    tok = session.get(CSRF_FIELD)
    if not tok:
        tok = session[CSRF_FIELD] = secrets.token_urlsafe(24)
    return tok


def check_csrf() -> None:
    given = request.headers.get(CSRF_HEADER) or request.form.get(CSRF_FIELD)
    if not _matches(given, session.get(CSRF_FIELD)):
        raise ApiError(403, f"{CSRF_FIELD}: missing or wrong CSRF token; reload the page", CSRF_FIELD)


def check_admin() -> str:
    """Admin credentials for a mutating request; returns how they were given ('bearer' or 'session')."""
    admin = ctx().settings.admin_token
    if not admin:
        raise ApiError(403, "actions are disabled: set PREWARM_ADMIN_TOKEN to enable them", "Authorization")
    if _bearer() is not None:
        if _matches(_bearer(), admin):
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
