"""The token throttle: a cap on wrong tries of a secret, per client address and for all clients together.

Two secrets are guarded, each with its own counts: the admin token (a console login or an API bearer token)
and the hook token (a hook's bearer token). The limits are PREWARM_LOGIN_MAX_FAILURES per client and
PREWARM_LOGIN_MAX_FAILURES_GLOBAL for all clients, per fixed 10-minute window, counted in Redis so every
gunicorn worker shares them.

- A client with `per client` wrong tries in the window is throttled: 429 with Retry-After before its token
  is compared, so a right guess does not show either. Its refused tries are not counted (one client
  hammering on after its own lockout must not use up the global limit).
- The global limit never refuses a right token: past it, each wrong try is answered 429 and throttles its
  client for the rest of the window (a guesser spread over many addresses gets one guess per address),
  while a client that is not throttled and presents the right token gets in.
- The log says so once per window and limit.

The admin token's tries are counted up front (a try that succeeds gives its count back), so concurrent
tries cannot slip past the per-client limit. The hook token is on the hot path: a right token costs no
Redis call. Its wrong tries are counted after the comparison, and a process remembers the clients it saw
throttled (`Context.throttled_clients`); only those are looked up in Redis before a right token is let
through. A client throttled by another gunicorn worker is remembered here at its next wrong try, so past
the limit at most one try per worker and in-flight request is compared.

The client is the TCP peer: behind a reverse proxy every client shares the proxy's address, and the
per-client limit then acts as a second global one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from prewarm import keys
from prewarm.context import Context
from web.util import ApiError

log = logging.getLogger(__name__)

WINDOW_S = 600
REMEMBERED_MAX = 10_000  # clients one process remembers as throttled; past it, older windows are dropped


@dataclass(frozen=True)
class Secret:
    """One guarded secret: its Redis scopes, and the words of its 429 and log line."""

    scope: str  # prefix of its counters' scopes ("" keeps the admin token's keys as they always were)
    failures: str  # "failed logins"
    log_line: str  # "login throttled"
    token: str  # "admin-token"


ADMIN = Secret("", "failed logins", "login throttled", "admin-token")
HOOK = Secret("hook:", "failed hook-token tries", "hook token throttled", "hook-token")


@dataclass(frozen=True)
class Attempt:
    """A counted try of the admin token; `succeeded` gives its count back."""

    client: str
    key: str


def _window(now: float) -> int:
    return int(now // WINDOW_S)


def _client_key(secret: Secret, client: str, window: int) -> str:
    return keys.login_attempts(f"{secret.scope}client:{client}", window)


def _all_key(secret: Secret, window: int) -> str:
    return keys.login_attempts(f"{secret.scope}all", window)


def _lock_key(secret: Secret, client: str, window: int) -> str:
    """Set when a wrong try came past the global limit: the client is throttled for the rest of the window."""
    return keys.login_attempts(f"{secret.scope}locked:client:{client}", window)


def _remember(c: Context, secret: Secret, client: str, window: int) -> None:
    seen = c.throttled_clients
    if len(seen) >= REMEMBERED_MAX:
        for name in [n for n, w in seen.items() if w != window]:
            seen.pop(name, None)
        if len(seen) >= REMEMBERED_MAX:
            seen.clear()  # the forgotten are remembered again at their next wrong try
    seen[secret.scope + client] = window


def remembered(c: Context, secret: Secret, client: str | None) -> bool:
    """Whether this process saw `client` throttled in the current window (a dict lookup, no Redis)."""
    return c.throttled_clients.get(secret.scope + (client or "unknown")) == _window(time.time())


def _refuse(c: Context, secret: Secret, client: str, field: str, mine: bool, now: float) -> ApiError:
    """The 429 for a client over its own limit (`mine`), or for one throttled by the global limit; logged once
    per window and limit."""
    window = _window(now)
    _remember(c, secret, client, window)
    who = f"from {client}" if mine else "from all clients together"
    limit = c.settings.login_max_failures if mine else c.settings.login_max_failures_global
    retry = int(WINDOW_S - now % WINDOW_S) + 1
    refused = keys.login_attempts(f"refused:{secret.scope}" + ("client:" + client if mine else "all"), window)
    pipe = c.r.pipeline(transaction=True)
    pipe.incr(refused)
    pipe.expire(refused, WINDOW_S)
    if pipe.execute()[0] == 1:  # the first refusal of this window: one line, not one per try
        log.warning("%s: more than %d failed %s tries %s in this %d-minute window; answering 429 for %d s",
                    secret.log_line, limit, secret.token, who, WINDOW_S // 60, retry)
    return ApiError(429, f"{field}: too many {secret.failures} {who} (at most {limit} per {WINDOW_S // 60} min); "
                         f"try again in {retry} s", field, {"Retry-After": str(retry)})


def _failed(c: Context, secret: Secret, client: str, field: str, now: float) -> ApiError | None:
    """Count a wrong try in the global count: past the global limit, the 429 that throttles its client
    for the rest of the window; else None (the caller answers 401)."""
    window = _window(now)
    pipe = c.r.pipeline(transaction=True)
    pipe.incr(_all_key(secret, window))
    pipe.expire(_all_key(secret, window), WINDOW_S)
    if pipe.execute()[0] <= c.settings.login_max_failures_global:
        return None
    c.r.set(_lock_key(secret, client, window), 1, ex=WINDOW_S)
    return _refuse(c, secret, client, field, False, now)


def _count_try(c: Context, secret: Secret, who: str, window: int) -> tuple[str, int, bool]:
    """Count one try of `secret` by `who` in its window: (its counter's key, the tries so far, locked)."""
    key = _client_key(secret, who, window)
    pipe = c.r.pipeline(transaction=True)
    pipe.incr(key)
    pipe.expire(key, WINDOW_S)
    pipe.exists(_lock_key(secret, who, window))
    n_mine, _, locked = pipe.execute()
    return key, n_mine, bool(locked)


# --- the admin token: counted up front ---------------------------------------------------------------
def attempt(c: Context, client: str | None, field: str) -> Attempt:
    """Count one try of the admin token before it is compared, or raise ApiError 429 when the client is
    throttled (over its limit, or locked by a wrong try past the global one)."""
    now, who = time.time(), client or "unknown"
    key, n_mine, locked = _count_try(c, ADMIN, who, _window(now))
    if n_mine <= c.settings.login_max_failures and not locked:
        return Attempt(who, key)
    c.r.decr(key)  # refused before the token was compared: not a try
    raise _refuse(c, ADMIN, who, field, not locked, now)


def succeeded(c: Context, tried: Attempt) -> None:
    """Give a try's count back: it was not a failure."""
    c.r.decr(tried.key)


def failed(c: Context, tried: Attempt, field: str) -> None:
    """A wrong admin token (its try stays counted); raises the 429 when it came past the global limit."""
    refusal = _failed(c, ADMIN, tried.client, field, time.time())
    if refusal is not None:
        raise refusal


# --- the hook token: counted after the comparison ------------------------------------------------------
def hook_refuse_if_throttled(c: Context, client: str | None, field: str) -> None:
    """For a client this process remembers as throttled: raise its 429 while Redis says it still is, else
    forget it (its window ended, or the count was cleared)."""
    now, who = time.time(), client or "unknown"
    window = _window(now)
    pipe = c.r.pipeline(transaction=False)
    pipe.get(_client_key(HOOK, who, window))
    pipe.exists(_lock_key(HOOK, who, window))
    n_mine, locked = pipe.execute()
    if int(n_mine or 0) >= c.settings.login_max_failures or locked:
        raise _refuse(c, HOOK, who, field, not locked, now)
    c.throttled_clients.pop(HOOK.scope + who, None)


def hook_failed(c: Context, client: str | None, field: str) -> None:
    """Count a wrong hook token; raises 429 when its client is throttled or it came past the global limit
    (the caller answers 401 otherwise)."""
    now, who = time.time(), client or "unknown"
    window = _window(now)
    key, n_mine, locked = _count_try(c, HOOK, who, window)
    if n_mine > c.settings.login_max_failures or locked:
        c.r.decr(key)  # refused as if before the comparison: not a try
        raise _refuse(c, HOOK, who, field, not locked, now)
    if n_mine == c.settings.login_max_failures:
        _remember(c, HOOK, who, window)  # its next try, right or wrong, is looked up (and refused)
    refusal = _failed(c, HOOK, who, field, now)
    if refusal is not None:
        raise refusal
