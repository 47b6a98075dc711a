"""Web security and robustness: every mutating route refuses without credentials, Redis down is a 503 in
words, secrets stay out of logs and the event log, and a property-based fuzz of /openapi.json finds no 5xx
and no 4xx without a message.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import requests
import schemathesis
from flask import Flask, request
from flask.json.tag import TaggedJSONSerializer
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from itsdangerous import BadSignature, URLSafeTimedSerializer

from prewarm import events, keys, traffic
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.redis_server import EmbeddedRedis, free_port
from tests.web_support import WebProc, make_catalog, make_context, publish_gpu, replica
from web.app import create_app

HOOK = "hook-secret-4711"
ADMIN = "admin-secret-0815"
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return make_catalog(tmp_path / "models")


@pytest.fixture
def app(redis_url: str, catalog: Path) -> Flask:
    return create_app(make_context(redis_url, catalog, hook_token=HOOK, admin_token=ADMIN))


def _state(r: redis.Redis) -> dict[bytes, object]:
    """Everything in Redis, to prove a refused request changed nothing (but the login throttle's count and
    the session-signing key, made on first use)."""
    out: dict[bytes, object] = {}
    readers = {b"hash": r.hgetall, b"set": r.smembers, b"string": r.get, b"list": lambda x: r.lrange(x, 0, -1),
               b"stream": r.xlen}
    for k in r.scan_iter(count=1000):
        if k.startswith(keys.LOGIN_ATTEMPTS_PREFIX.encode()) or k == keys.SESSION_SECRET.encode():
            continue
        kind = r.type(k)
        out[k] = readers[kind](k) if kind in readers else kind
    return out


def test_every_mutating_route_refuses_without_credentials(app: Flask, r: redis.Redis) -> None:
    publish_gpu(r, "node-a/cpu:0", replicas=[replica("alpha", "node-a/cpu:0", "ready")])
    client = app.test_client()
    checked = []
    for rule in app.url_map.iter_rules():
        methods = (rule.methods or set()) & MUTATING
        if not methods or rule.endpoint == "static":
            continue
        url = re.sub(r"<(?:[^:>]+:)?(\w+)>", lambda m: {"action": "pin"}.get(m.group(1), "alpha"), rule.rule)
        for method in methods:
            # each route's wrong tokens on a fresh throttle window: past PREWARM_LOGIN_MAX_FAILURES the answer
            # is the throttle's 429, which would hide whether this route refuses by itself
            for k in r.scan_iter(match=keys.LOGIN_ATTEMPTS_PREFIX + "*"):
                r.delete(k)
            before = _state(r)
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {HOOK}"}
                            if rule.rule.startswith("/api") else {"Authorization": f"Bearer {ADMIN}"}):
                resp = client.open(url, method=method, headers=headers, json={"model": "alpha", "version": "v1",
                                                                              "traffic_fraction": 0.5})
                refused = resp.status_code in (401, 403) or (
                    resp.status_code == 302 and "/login" in resp.headers.get("Location", ""))
                assert refused, f"{method} {url} with {headers} answered {resp.status_code}"
            assert _state(r) == before, f"{method} {url} changed state without credentials"
            checked.append(f"{method} {rule.rule}")
    expected = {"POST /hooks/requests", "POST /hooks/rollout", "POST /api/models/<model>/preload",
                "POST /api/models/<model>/evict", "POST /api/models/<model>/pin", "POST /api/models/<model>/unpin",
                "POST /actions/<model>/<action>", "POST /actions/preload", "POST /login", "POST /logout",
                "POST /api/nodes/<node>/drain", "DELETE /api/nodes/<node>/drain"}
    assert expected <= set(checked), set(checked)


def test_route_hook_needs_the_hook_token_too(app: Flask, r: redis.Redis) -> None:
    publish_gpu(r, "node-a/cpu:0")
    client = app.test_client()
    assert client.get("/hooks/route?model=alpha").status_code == 401  # it can enqueue a preload
    assert not r.exists(keys.cold_claim("alpha@v1"))
    ok = client.get("/hooks/route?model=alpha", headers={"Authorization": f"Bearer {HOOK}"})
    assert ok.status_code == 200


def test_redis_down_is_a_503_in_words(catalog: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = create_app(make_context(dead, catalog, admin_token=ADMIN)).test_client()
    auth = {"Authorization": f"Bearer {ADMIN}"}
    for method, url in (("get", "/healthz"), ("post", "/hooks/requests"), ("get", "/hooks/route?model=alpha"),
                        ("get", "/api/fleet"), ("get", "/api/models"), ("get", "/api/events"),
                        ("post", "/api/models/alpha/pin"), ("get", "/metrics")):
        resp = getattr(client, method)(url, json={"model": "alpha"}, headers=auth)
        assert resp.status_code == 503, url
        assert "Redis is unavailable" in resp.get_json()["error"] and "Traceback" not in resp.get_data(as_text=True)
        assert resp.headers["Retry-After"]
    page = client.get("/fleet")
    assert page.status_code == 503 and "Redis is unavailable" in page.get_data(as_text=True)
    client.set_cookie("prewarm_session", "a-cookie-that-cannot-be-verified-now")
    for url in ("/login", "/logout", "/actions/alpha/pin", "/api/models/alpha/pin"):  # not "log in" or "bad CSRF"
        resp = client.post(url, data={"token": ADMIN, "csrf_token": "x"})
        assert resp.status_code == 503 and "Redis is unavailable" in resp.get_data(as_text=True), url
    assert client.get("/login").status_code == 200  # the form itself needs no Redis


def test_redis_restart_recovers(catalog: Path) -> None:
    server = EmbeddedRedis().start()
    try:
        client = create_app(make_context(server.url, catalog)).test_client()
        assert client.post("/hooks/requests", json={"model": "alpha"}).status_code == 202
        server.stop()
        assert client.get("/healthz").status_code == 503
        assert client.post("/hooks/requests", json={"model": "alpha"}).status_code == 503
        server = EmbeddedRedis(port=server.port).start()  # back, empty (no persistence)
        assert client.get("/healthz").status_code == 200
        assert client.post("/hooks/requests", json={"model": "alpha"}).status_code == 202
    finally:
        server.stop()


def test_secrets_stay_out_of_logs_and_events(app: Flask, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    publish_gpu(r, "node-a/cpu:0")
    client = app.test_client()
    client.post("/hooks/requests", json={"model": "alpha"}, headers={"Authorization": f"Bearer {HOOK}x"})
    client.get("/hooks/route?model=alpha", headers={"Authorization": f"Bearer {HOOK}"})
    client.post("/api/models/beta/preload", headers={"Authorization": f"Bearer {ADMIN}"})
    client.post("/api/models/beta/pin", headers={"Authorization": f"Bearer {ADMIN}y"})
    html = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    client.post("/login", data={"token": ADMIN, "csrf_token": token})
    client.post("/login", data={"token": ADMIN + "z", "csrf_token": token})
    logged = caplog.text + str([e.public() for e in events.read(r)]) + str(_state(r))
    assert HOOK not in logged and ADMIN not in logged


def test_openapi_describes_every_api_route(app: Flask) -> None:
    spec = app.test_client().get("/openapi.json").get_json()
    assert spec["openapi"].startswith("3.")
    documented = {re.sub(r"\{(\w+)\}", r"<\1>", p) for p in spec["paths"]}
    routes = {rule.rule for rule in app.url_map.iter_rules() if rule.rule.startswith(("/hooks", "/api", "/healthz"))}
    assert routes == documented


# --- console sessions and the login throttle, against a real `prewarm web` (2 gunicorn workers) ----------
COOKIE = "prewarm_session"
PER_CLIENT, OVERALL = 3, 5  # failed tries of the admin token allowed per client address / from all of them


@pytest.fixture
def secure_web(redis_url: str, catalog: Path, tmp_path: Path) -> Iterator[WebProc]:
    w = WebProc(redis_url, catalog, tmp_path, workers=2,
                env={"PREWARM_ADMIN_TOKEN": ADMIN, "PREWARM_HOOK_TOKEN": HOOK,
                     "PREWARM_LOGIN_MAX_FAILURES": str(PER_CLIENT),
                     "PREWARM_LOGIN_MAX_FAILURES_GLOBAL": str(OVERALL)})
    yield w
    w.stop()


class _FromAddress(requests.adapters.HTTPAdapter):
    """Connect from a chosen loopback address (Linux routes all of 127/8 to lo): another client, as far
    as the web can tell."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - urllib3's signature
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


def _browser(address: str = "127.0.0.1") -> requests.Session:
    s = requests.Session()
    s.mount("http://", _FromAddress(address))
    return s


def _page_csrf(s: requests.Session, url: str) -> str:
    m = re.search(r'name="csrf_token" value="([^"]+)"', s.get(url, timeout=10).text)
    assert m, f"no CSRF token on {url}"
    return m.group(1)


def _try_login(s: requests.Session, web: WebProc, token: str) -> requests.Response:
    return s.post(web.url + "/login", data={"token": token, "csrf_token": _page_csrf(s, web.url + "/login"),
                                            "next": "/fleet"}, allow_redirects=False, timeout=10)


def _token_derived_serializer(token: str) -> URLSafeTimedSerializer:
    """How the session cookie used to be signed: a key derived from the admin token and a constant."""
    key = hmac.new(token.encode(), b"prewarm console session v1", hashlib.sha256).digest()
    return URLSafeTimedSerializer(key, salt="cookie-session", serializer=TaggedJSONSerializer(),
                                  signer_kwargs={"key_derivation": "hmac", "digest_method": hashlib.sha1})


def test_a_cookie_saved_before_logout_is_refused_after(secure_web: WebProc, r: redis.Redis) -> None:
    s = _browser()
    assert _try_login(s, secure_web, ADMIN).status_code == 302
    csrf = _page_csrf(s, secure_web.url + "/fleet")
    saved = s.cookies[COOKIE]
    assert s.post(secure_web.url + "/api/models/alpha/pin", headers={"X-CSRF-Token": csrf}, timeout=10).status_code == 200
    assert s.post(secure_web.url + "/logout", data={"csrf_token": csrf}, allow_redirects=False,
                  timeout=10).status_code == 302
    replay = requests.Session()  # someone who kept a copy of the cookie (either gunicorn worker may answer)
    replay.cookies.set(COOKIE, saved)
    for _ in range(4):
        resp = replay.post(secure_web.url + "/api/models/alpha/unpin", headers={"X-CSRF-Token": csrf}, timeout=10)
        assert resp.status_code == 401, resp.text
        resp = replay.post(secure_web.url + "/actions/alpha/unpin", data={"csrf_token": csrf},
                           allow_redirects=False, timeout=10)
        assert resp.status_code == 302 and "/login" in resp.headers["Location"]
    assert r.sismember(keys.PINNED, "alpha")
    assert not list(r.scan_iter(keys.web_session("*")))  # the server-side session is gone


def test_cookies_are_not_signed_with_a_key_derived_from_the_admin_token(secure_web: WebProc,
                                                                         r: redis.Redis) -> None:
    anyone = requests.Session()
    anyone.get(secure_web.url + "/login", timeout=10)  # hands any visitor a signed cookie (its CSRF token)
    old = _token_derived_serializer(ADMIN)
    with pytest.raises(BadSignature):  # so the cookie is no way to test guesses of the token offline
        old.loads(anyone.cookies[COOKIE])
    forged = old.dumps({"admin": True, "csrf_token": "forged"})
    resp = requests.post(secure_web.url + "/api/models/alpha/pin", cookies={COOKIE: forged},
                         headers={"X-CSRF-Token": "forged"}, timeout=10)
    assert resp.status_code == 401 and not r.sismember(keys.PINNED, "alpha")
    assert len(r.get(keys.SESSION_SECRET) or b"") >= 32  # the random key every worker signs with


def _copy_session(src: FlaskClient, dst: FlaskClient) -> None:
    dst.set_cookie(COOKIE, src.get_cookie(COOKIE).value)


def test_changing_the_admin_token_ends_every_session(redis_url: str, catalog: Path, r: redis.Redis) -> None:
    first = create_app(make_context(redis_url, catalog, admin_token=ADMIN)).test_client()
    html = first.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
    assert first.post("/login", data={"token": ADMIN, "csrf_token": csrf}).status_code == 302
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', first.get("/fleet").get_data(as_text=True)).group(1)
    restarted = create_app(make_context(redis_url, catalog, admin_token=ADMIN)).test_client()
    _copy_session(first, restarted)  # a restart (or another web process) with the same token: still logged in
    assert restarted.post("/api/models/alpha/pin", headers={"X-CSRF-Token": csrf}).status_code == 200
    rotated = create_app(make_context(redis_url, catalog, admin_token="a-new-admin-token-4242")).test_client()
    _copy_session(first, rotated)
    assert rotated.post("/api/models/alpha/unpin", headers={"X-CSRF-Token": csrf}).status_code == 401
    assert not list(r.scan_iter(keys.web_session("*")))  # ended for good, not only while the new token holds
    assert first.post("/api/models/alpha/unpin", headers={"X-CSRF-Token": csrf}).status_code == 401
    assert r.sismember(keys.PINNED, "alpha")


def test_secret_key_from_the_environment(redis_url: str, catalog: Path, r: redis.Redis) -> None:
    key = "k" * 40
    ctx = make_context(redis_url, catalog, admin_token=ADMIN)
    env_ctx = type(ctx)(Settings.from_env({**_env(redis_url, catalog), "PREWARM_SECRET_KEY": key}),
                        start_redis=False)
    client = create_app(env_ctx).test_client()
    client.get("/login")
    cookie = client.get_cookie(COOKIE).value
    signed = URLSafeTimedSerializer(key.encode(), salt="cookie-session", serializer=TaggedJSONSerializer(),
                                    signer_kwargs={"key_derivation": "hmac", "digest_method": hashlib.sha256})
    assert "csrf_token" in signed.loads(cookie)
    assert not r.exists(keys.SESSION_SECRET)
    with pytest.raises(ValueError, match="PREWARM_SECRET_KEY: 5 characters is too short"):
        Settings.from_env({"PREWARM_SECRET_KEY": "short"})


def _env(redis_url: str, catalog: Path) -> dict[str, str]:
    return {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_NODE": "test-node",
            "PREWARM_DATA_DIR": str(catalog.parent), "PREWARM_ADMIN_TOKEN": ADMIN}


def test_wrong_logins_are_throttled_per_client_and_for_all(secure_web: WebProc, r: redis.Redis) -> None:
    first = _browser("127.0.0.1")
    for _ in range(PER_CLIENT):
        assert _try_login(first, secure_web, "guess").status_code == 401
    resp = _try_login(first, secure_web, ADMIN)  # even the right token: a right guess must not show
    assert resp.status_code == 429, resp.text
    assert "too many failed logins from 127.0.0.1" in resp.text and int(resp.headers["Retry-After"]) > 0
    api = requests.post(secure_web.url + "/api/models/alpha/pin", headers={"Authorization": f"Bearer {ADMIN}"},
                        timeout=10)  # the API's bearer token is the same secret: the same throttle
    assert api.status_code == 429 and api.json()["field"] == "Authorization" and api.headers["Retry-After"]
    second = _browser("127.0.0.2")  # another client is not locked out by the first one's failures
    assert _try_login(second, secure_web, ADMIN).status_code == 302
    for _ in range(OVERALL - PER_CLIENT):
        assert _try_login(second, secure_web, "guess").status_code == 401
    # The global limit is spent, by many clients guessing: it never refuses a right token from a client
    # that is not throttled itself (a lockout of the operator), only wrong ones.
    third = _browser("127.0.0.3")
    assert _try_login(third, secure_web, ADMIN).status_code == 302
    api = third.post(secure_web.url + "/api/models/alpha/pin", headers={"Authorization": f"Bearer {ADMIN}"},
                     timeout=10)
    assert api.status_code == 200 and r.sismember(keys.PINNED, "alpha")
    # ...while a wrong try past it is a 429 that throttles its client for the rest of the window: a guesser
    # spread over many addresses gets one guess per address
    fourth = _browser("127.0.0.4")
    resp = _try_login(fourth, secure_web, "guess")
    assert resp.status_code == 429 and "from all clients together" in resp.text, resp.text
    resp = _try_login(fourth, secure_web, ADMIN)
    assert resp.status_code == 429 and "from all clients together" in resp.text, resp.text
    log = secure_web.log()
    assert log.count("login throttled") == 2, log  # once per limit passed in this window, not once per try
    assert ADMIN not in log


# --- the hook token's throttle ---------------------------------------------------------------------
WRONG, RIGHT = {"Authorization": "Bearer guess"}, {"Authorization": f"Bearer {HOOK}"}
HOOK_OVERALL = 7  # failed hook-token tries from all clients: two clients can each spend their own limit


def _from(app: Flask, address: str) -> FlaskClient:
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address  # the peer address the web sees
    return client


def _throttle_reads(r: redis.Redis) -> dict[str, int]:
    """How many times Redis ran the commands the throttle uses (INCR, GET, EXISTS) so far."""
    stats = r.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("incr", "get", "exists")}


def test_wrong_hook_tokens_are_throttled_through_the_fast_path_and_the_view(
        redis_url: str, catalog: Path, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    env = {**_env(redis_url, catalog), "PREWARM_HOOK_TOKEN": HOOK, "PREWARM_LOGIN_MAX_FAILURES": str(PER_CLIENT),
           "PREWARM_LOGIN_MAX_FAILURES_GLOBAL": str(HOOK_OVERALL)}
    app = create_app(Context(Settings.from_env(env), start_redis=False))
    seen: list[str] = []  # every request Flask itself handled (the rest the fast path answered)
    app.before_request(lambda: seen.append(request.path))
    publish_gpu(r, "node-a/cpu:0")
    event = {"model": "alpha"}

    fast = _from(app, "10.0.0.1")  # a body the fast path would take: the fast path's rule
    for _ in range(PER_CLIENT):
        assert fast.post("/hooks/requests", json=event, headers=WRONG).status_code == 401
    for headers in (WRONG, RIGHT):  # the right token too: a right guess must not show
        resp = fast.post("/hooks/requests", json=event, headers=headers)
        assert resp.status_code == 429, resp.get_json()
        assert "too many failed hook-token tries from 10.0.0.1" in resp.get_json()["error"]
        assert int(resp.headers["Retry-After"]) > 0
    assert fast.get("/hooks/route?model=alpha", headers=RIGHT).status_code == 429

    view = _from(app, "10.0.0.2")  # GET /hooks/route is the Flask view's alone
    for _ in range(PER_CLIENT):
        assert view.get("/hooks/route?model=alpha", headers=WRONG).status_code == 401
    assert view.get("/hooks/route?model=alpha", headers=RIGHT).status_code == 429
    assert view.post("/hooks/requests", json=event, headers=RIGHT).status_code == 429
    assert traffic.totals(r) == {} and not r.exists(keys.cold_claim("alpha@v1"))

    # No token at all guesses nothing; the 7th wrong try spends the global limit.
    assert _from(app, "10.0.0.3").post("/hooks/requests", json=event).status_code == 401
    assert _from(app, "10.0.0.3").post("/hooks/requests", json=event, headers=WRONG).status_code == 401

    fresh = _from(app, "10.0.0.4")  # past the global limit a right token still gets in...
    seen.clear()
    before = _throttle_reads(r)
    assert fresh.post("/hooks/requests", json=event, headers=RIGHT).status_code == 202
    assert seen == [] and _throttle_reads(r) == before  # ...on the fast path, and with no throttle lookup
    assert fresh.get("/hooks/route?model=beta", headers=RIGHT).status_code == 200
    assert traffic.totals(r) == {"alpha": 1}
    resp = fresh.get("/hooks/route?model=alpha", headers=WRONG)  # a wrong one is refused, and locks its address
    assert resp.status_code == 429 and "from all clients together" in resp.get_json()["error"]
    assert fresh.post("/hooks/requests", json=event, headers=RIGHT).status_code == 429
    assert traffic.totals(r) == {"alpha": 1}
    # once per client over its own limit and once for the global one, not once per try
    assert caplog.text.count("hook token throttled") == 3 and HOOK not in caplog.text


def test_prewarm_web_throttles_wrong_hook_tokens(redis_url: str, catalog: Path, tmp_path: Path,
                                                 r: redis.Redis) -> None:
    # One gunicorn worker: a worker learns that a client is throttled from Redis at that client's next
    # wrong try (web.throttle), so with two, a right token could still land on the one that has not yet.
    w = WebProc(redis_url, catalog, tmp_path, workers=1,
                env={"PREWARM_HOOK_TOKEN": HOOK, "PREWARM_LOGIN_MAX_FAILURES": str(PER_CLIENT)})
    try:
        guesser = _browser("127.0.0.5")
        hook = w.url + "/hooks/requests"
        for _ in range(PER_CLIENT):
            assert guesser.post(hook, json={"model": "alpha"}, headers=WRONG, timeout=10).status_code == 401
        resp = guesser.post(hook, json={"model": "alpha"}, headers=RIGHT, timeout=10)
        assert resp.status_code == 429 and resp.json()["field"] == "Authorization" and resp.headers["Retry-After"]
        resp = guesser.get(w.url + "/hooks/route?model=alpha", headers=RIGHT, timeout=10)
        assert resp.status_code == 429
        router = _browser("127.0.0.6")
        assert router.post(hook, json={"model": "alpha"}, headers=RIGHT, timeout=10).status_code == 202
        assert traffic.totals(r) == {"alpha": 1}
        log = w.log()
        assert "hook token throttled" in log and HOOK not in log
    finally:
        w.stop()


# --- the bind address --------------------------------------------------------------------------------
@pytest.mark.parametrize("told", ["--host", "PREWARM_WEB_HOST"])
def test_prewarm_web_refuses_open_hooks_off_loopback(tmp_path: Path, told: str) -> None:
    import os
    import signal
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update({"PREWARM_DATA_DIR": str(tmp_path), "PORT": str(free_port()), "PYTHONPATH": str(repo)})
    argv = [sys.executable, "-m", "prewarm.programs.cli", "web"]
    if told == "--host":
        argv += ["--host", "0.0.0.0"]
    else:
        env["PREWARM_WEB_HOST"] = "0.0.0.0"
    proc = subprocess.Popen(argv, env=env, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
        pytest.fail("prewarm web served open hooks on 0.0.0.0")
    assert proc.returncode == 2, err
    assert "refusing to serve the hooks on 0.0.0.0 without a hook token" in err
    assert "PREWARM_HOOK_TOKEN" in err and "--insecure-no-hook-token" in err and "Traceback" not in err
    with pytest.raises(ProcessLookupError):  # nothing it started is left behind
        os.killpg(proc.pid, 0)
    assert not (tmp_path / "redis.url").exists()  # refused before it started a Redis


# --- property-based fuzz ---------------------------------------------------------------------------
def has_error_message(ctx, response, case) -> None:  # noqa: ANN001 - schemathesis check signature
    """Every 4xx answers in words: a JSON object with a non-empty `error`."""
    if 400 <= response.status_code < 500:
        body = response.json()
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], \
            f"{response.status_code} without an error message: {response.text[:200]}"


@pytest.fixture
def fuzz_schema(redis_url: str, catalog: Path, r: redis.Redis) -> schemathesis.BaseSchema:
    publish_gpu(r, "node-a/cpu:0", total_mib=64, replicas=[replica("alpha", "node-a/cpu:0", "ready")], ttl=600)
    app = create_app(make_context(redis_url, catalog, hook_token=HOOK, admin_token=ADMIN))
    return schemathesis.openapi.from_wsgi("/openapi.json", app)


def test_fuzz_api(fuzz_schema: schemathesis.BaseSchema) -> None:
    """Bounded: a fixed number of derandomized examples per operation (pytest plugin of schemathesis does
    not support this pytest, so hypothesis is driven directly)."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

    checks = [not_a_server_error, status_code_conformance, content_type_conformance, has_error_message]
    operations = [result.ok() for result in fuzz_schema.get_all_operations()]
    assert len(operations) >= 11
    for op in operations:
        headers = {"Authorization": f"Bearer {HOOK if op.path.startswith('/hooks') else ADMIN}"}
        strategies = [op.as_strategy()]
        if op.body or op.path_parameters or op.query:  # nothing to make invalid otherwise
            strategies.append(op.as_strategy(schemathesis.GenerationMode.NEGATIVE))
        # Random ids are almost never in the catalog; also fuzz everything else around a real model.
        if "{model}" in op.path:
            strategies.append(op.as_strategy(path_parameters={"model": "alpha"}))
        if op.path == "/hooks/route":
            strategies.append(op.as_strategy(query={"model": "beta"}))
        for strategy in strategies:
            given(case=strategy)(
                settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
                         derandomize=True, database=None)(_fuzz_one(headers, checks)))()


def _fuzz_one(headers: dict[str, str], checks: list) -> Callable[[schemathesis.Case], None]:
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=headers, checks=checks)

    return run


def test_web_never_imports_torch(redis_url: str, tmp_path: Path) -> None:
    """Serving the real demo models' catalog (builders in gpu_worker) must not pull torch into web."""
    import subprocess
    import sys

    from tests.model_files import tiny_catalog

    catalog = tiny_catalog(tmp_path / "models", ["tiny-lm"])
    code = f"""
import sys
from tests.web_support import make_context
from pathlib import Path
from web.app import create_app
client = create_app(make_context({redis_url!r}, Path({str(catalog)!r}), admin_token="t")).test_client()
for url in ("/api/models", "/hooks/route?model=tiny-lm", "/fleet", "/models", "/metrics", "/openapi.json"):
    assert client.get(url).status_code == 200, url
assert client.post("/hooks/requests", json={{"model": "tiny-lm"}}).status_code == 202
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "gpu_worker.")))
assert not heavy, heavy
"""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
