"""Settings keep their secrets out of repr/str, and the web's default bind is loopback (./run included)."""

from __future__ import annotations

import argparse
import shlex

import pytest

from prewarm.config import Settings, repo_root
from prewarm.config_errors import redacted
from web.cli import bind_host, is_loopback, open_hooks_refusal

SECRETS = {"PREWARM_ADMIN_TOKEN": "admin-sekrit-0815", "PREWARM_HOOK_TOKEN": "hook-sekrit-4711",
           "PREWARM_SECRET_KEY": "k3y-" + "s" * 40,
           "PREWARM_REDIS_URL": "rediss://prewarm:redis-pw-9%2F9@redis.example:6380/2"
                                "?ssl_password=tls-key-passphrase&ssl_cert_reqs=required"}


def test_repr_and_str_show_no_secret_but_say_which_are_set() -> None:
    s = Settings.from_env(SECRETS)
    assert s.admin_token == SECRETS["PREWARM_ADMIN_TOKEN"]  # the values themselves are untouched
    for text in (repr(s), str(s), f"{s}", repr([s])):
        for secret in ("admin-sekrit-0815", "hook-sekrit-4711", "s" * 40, "redis-pw", "tls-key-passphrase"):
            assert secret not in text, f"{secret} shown in {text}"
        assert "admin_token='***'" in text and "hook_token='***'" in text and "secret_key='***'" in text
        assert "redis.example:6380/2" in text and "ssl_cert_reqs=required" in text  # the rest still shows
    unset = repr(Settings.from_env({}))
    assert "admin_token=None" in unset and "hook_token=None" in unset and "redis_url=None" in unset


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
    ("redis://user:pw@[::1]:6379/0", "redis://user:***@[::1]:6379/0"),
    ("redis://h:6379/0?password=pw&db=1", "redis://h:6379/0?password=***&db=1"),
    ("unix:///run/redis.sock?password=pw", "unix:///run/redis.sock?password=***"),
    ("redis://h:6379/0", "redis://h:6379/0"),
])
def test_redacted_masks_the_password_wherever_the_url_carries_it(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_the_web_binds_loopback_unless_told_otherwise() -> None:
    assert Settings.from_env({}).web_host == "127.0.0.1"
    assert Settings.from_env({"PREWARM_WEB_HOST": "0.0.0.0"}).web_host == "0.0.0.0"
    assert Settings.from_env({"PREWARM_WEB_HOST": "  "}).web_host == "127.0.0.1"  # gunicorn reads "" as all
    told = argparse.Namespace(host="::1")
    assert bind_host(told, Settings.from_env({"PREWARM_WEB_HOST": "0.0.0.0"})) == "::1"  # --host wins


def test_quick_start_web_binds_loopback() -> None:
    """./run is `prewarm up`, which runs the Procfile's web line with the caller's environment: with no
    PREWARM_WEB_HOST that line binds loopback."""
    from prewarm.programs.cli import build_parser

    assert "exec prewarm up" in (repo_root() / "run").read_text()
    lines = dict(line.split(":", 1) for line in (repo_root() / "Procfile").read_text().splitlines() if line.strip())
    argv = shlex.split(lines["web"])
    assert argv[0] == "prewarm"
    args = build_parser().parse_args(argv[1:])
    assert bind_host(args, Settings.from_env({})) == "127.0.0.1"
    assert not args.insecure_no_hook_token


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.7", False), ("web.example", False),
])
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_open_hooks_are_refused_off_loopback_unless_a_token_or_the_opt_out() -> None:
    open_ = Settings.from_env({})
    refusal = open_hooks_refusal("0.0.0.0", open_, insecure=False)
    assert refusal and "PREWARM_HOOK_TOKEN" in refusal and "--insecure-no-hook-token" in refusal
    assert open_hooks_refusal("127.0.0.1", open_, insecure=False) is None
    assert open_hooks_refusal("0.0.0.0", open_, insecure=True) is None
    assert open_hooks_refusal("0.0.0.0", Settings.from_env({"PREWARM_HOOK_TOKEN": "t"}), insecure=False) is None


def test_up_gives_an_exposed_web_a_hook_token() -> None:
    """`PREWARM_WEB_HOST=0.0.0.0 ./run` must not fail on the refusal above: `prewarm up` makes a hook token
    for the web and its traffic player, as it does the admin token; on loopback it adds none."""
    from prewarm.programs.up import exposed_hook_token

    local: dict[str, str] = {}
    assert exposed_hook_token(local, "127.0.0.1") == "" and "PREWARM_HOOK_TOKEN" not in local
    exposed: dict[str, str] = {}
    line = exposed_hook_token(exposed, "0.0.0.0")
    assert len(exposed["PREWARM_HOOK_TOKEN"]) >= 16 and exposed["PREWARM_HOOK_TOKEN"] in line
    given = {"PREWARM_HOOK_TOKEN": "mine"}
    assert exposed_hook_token(given, "0.0.0.0") == "" and given["PREWARM_HOOK_TOKEN"] == "mine"
