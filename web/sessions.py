"""Console sessions: cookies signed with a random secret, and a server-side record per logged-in session.

- The signing key is PREWARM_SECRET_KEY, or else a random key kept in Redis (keys.SESSION_SECRET), made
  once with SET NX by whichever web process needs it first, so every gunicorn worker signs alike. It is
  never derived from the admin token: a cookie (GET /login hands one to anyone, for its CSRF token) must
  not let the token be tested offline.
- A login creates a record (keys.web_session) with the session's lifetime as TTL; the cookie carries its id.
  A session is live only while the record exists, so /logout (which deletes it) ends it for every copy
  of the cookie.
- The cookie also carries a fingerprint of the admin token keyed with the signing key; when the token
  changes no old session matches it: rotating the token logs everyone out. (Keyed, and kept in the
  cookie only, so neither the cookie without the key nor Redis without the cookie can test a guess.)

Requests without a session cookie (the hooks, scrapes) never touch Redis here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time

import redis
from flask import Flask, Request, Response, g
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface, SessionMixin
from itsdangerous import URLSafeTimedSerializer

from prewarm import keys
from prewarm.context import Context

log = logging.getLogger(__name__)


def signing_key(c: Context) -> bytes:
    """PREWARM_SECRET_KEY, or the shared random key in Redis (created on first use); cached per request."""
    if c.settings.secret_key:
        return c.settings.secret_key.encode()
    cached = g.get("_pw_signing_key")
    if cached is None:
        raw = c.r.get(keys.SESSION_SECRET)
        if raw is None:
            c.r.set(keys.SESSION_SECRET, secrets.token_hex(32), nx=True)  # the first writer wins
            raw = c.r.get(keys.SESSION_SECRET)
        if raw is None:  # deleted between the SET and the GET: a Redis flush; the next request retries
            raise redis.RedisError("session secret vanished while being created")
        cached = g._pw_signing_key = bytes(raw)
    return cached


def token_fingerprint(c: Context) -> str:
    """The current admin token's fingerprint, keyed with the signing key (see the module docstring)."""
    token = c.settings.admin_token or ""
    return hmac.new(signing_key(c), b"prewarm admin token\0" + token.encode(), hashlib.sha256).hexdigest()


def create(c: Context, lifetime_s: int, client: str | None) -> dict[str, str]:
    """A new server-side session; returns what the cookie must carry."""
    sid = secrets.token_urlsafe(32)
    c.r.set(keys.web_session(sid), json.dumps({"created": time.time(), "client": client}), ex=lifetime_s)
    return {"sid": sid, "fp": token_fingerprint(c)}


def is_live(c: Context, cookie: SessionMixin) -> bool:
    """The cookie's session was created by a login with the current admin token and not logged out."""
    sid, fp = cookie.get("sid"), cookie.get("fp")
    if not isinstance(sid, str) or not isinstance(fp, str) or not c.settings.admin_token:
        return False
    if not hmac.compare_digest(fp.encode(), token_fingerprint(c).encode()):
        c.r.delete(keys.web_session(sid))  # logged in with an earlier admin token: over for good
        return False
    return bool(c.r.exists(keys.web_session(sid)))


def require_store() -> None:
    """Raise the RedisError that kept this request's cookie from being verified, if one did (a 503)."""
    exc = g.get("_pw_session_error")
    if exc is not None:
        raise exc


def revoke(c: Context, cookie: SessionMixin) -> None:
    sid = cookie.get("sid")
    if isinstance(sid, str):
        c.r.delete(keys.web_session(sid))


class RedisKeyedSessions(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, signed with `signing_key` (and SHA-256) instead of app.secret_key."""

    digest_method = staticmethod(hashlib.sha256)

    def get_signing_serializer(self, app: Flask) -> URLSafeTimedSerializer:
        return URLSafeTimedSerializer(signing_key(app.extensions["prewarm"]), salt=self.salt,
                                      serializer=self.serializer,
                                      signer_kwargs={"key_derivation": self.key_derivation,
                                                     "digest_method": self.digest_method})

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession:
        if not request.cookies.get(self.get_cookie_name(app)):
            return self.session_class()  # nothing to verify: no Redis round trip
        try:
            return super().open_session(app, request) or self.session_class()
        except redis.RedisError as exc:
            # Raising here would bypass the app's error handlers (a bare 500): start empty instead, and
            # let whatever needs the session answer 503 (`require_store`), not "log in" or "bad CSRF token".
            log.warning("session cookie not verified: Redis unavailable (%s)", exc.__class__.__name__)
            g._pw_session_error = exc
            return self.session_class()

    def save_session(self, app: Flask, session: SessionMixin, response: Response) -> None:
        try:
            super().save_session(app, session, response)
        except redis.RedisError as exc:
            log.warning("session cookie not saved: Redis unavailable (%s)", exc.__class__.__name__)
