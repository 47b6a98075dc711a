"""The login throttle: a cap on failed admin-token tries, per client address and for all clients together.

Every try of the admin token counts (a console login, or an API request with a bearer token): it is
counted up front, in Redis, so every gunicorn worker shares the count and concurrent tries cannot slip
past the limit; a try that succeeds, or is refused, gives its count back, so only failures add up. Over
either limit the answer is 429 with Retry-After, before the token is even compared (a right guess would
otherwise still show), and the log says so once per window. Fixed 10-minute windows; the limits are PREWARM_LOGIN_MAX_FAILURES (per client) and
PREWARM_LOGIN_MAX_FAILURES_GLOBAL. The client is the peer address: behind a reverse proxy all clients
share the proxy's, and the per-client limit acts like the global one.
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


@dataclass(frozen=True)
class Attempt:
    """A counted try; `succeeded` gives its count back."""

    keys: tuple[str, str]


def attempt(c: Context, client: str | None, field: str) -> Attempt:
    """Count one try of the admin token, or raise ApiError 429 when the client or everyone is over the limit."""
    now = time.time()
    window = int(now // WINDOW_S)
    scopes = (f"client:{client or 'unknown'}", "all")
    tried = Attempt((keys.login_attempts(scopes[0], window), keys.login_attempts(scopes[1], window)))
    pipe = c.r.pipeline(transaction=True)
    for key in tried.keys:
        pipe.incr(key)
        pipe.expire(key, WINDOW_S)
    n_mine, _, n_all, _ = pipe.execute()
    per_client, overall = c.settings.login_max_failures, c.settings.login_max_failures_global
    if n_mine <= per_client and n_all <= overall:
        return tried
    mine_over = n_mine > per_client
    who = f"from {client}" if mine_over else "from all clients together"
    limit = per_client if mine_over else overall
    retry = int(WINDOW_S - now % WINDOW_S) + 1
    refused = keys.login_attempts("refused:" + scopes[0 if mine_over else 1], window)
    pipe = c.r.pipeline(transaction=True)
    for key in tried.keys:  # refused before the token was compared, so not a try: one client hammering
        pipe.decr(key)      # on after its own lockout must not use up the global limit
    pipe.incr(refused)
    pipe.expire(refused, WINDOW_S)
    if pipe.execute()[2] == 1:  # the first refusal of this window: one line, not one per try
        log.warning("login throttled: more than %d failed admin-token tries %s in this %d-minute window; "
                    "answering 429 for %d s", limit, who, WINDOW_S // 60, retry)
    raise ApiError(429, f"{field}: too many failed logins {who} (at most {limit} per {WINDOW_S // 60} min); "
                        f"try again in {retry} s", field, {"Retry-After": str(retry)})


def succeeded(c: Context, tried: Attempt) -> None:
    """Give a try's count back: it was not a failure."""
    pipe = c.r.pipeline(transaction=True)
    for key in tried.keys:
        pipe.decr(key)
    pipe.execute()
