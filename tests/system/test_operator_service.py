"""Operator actions have one path (prewarm.services.operator) behind the API, the console and the CLI: the same
refusal reads the same through each, and an action is marked the same whoever sent it (issue 25, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient
from markupsafe import escape

from prewarm import events
from tests.system.test_api import ADMIN, AUTH, _login
from tests.system.test_worker_process import _cli
from tests.web_support import make_catalog, make_context, publish_gpu, queued_tasks, replica
from web.app import create_app

GPU_A = "node-a/cpu:0"


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return make_catalog(tmp_path / "models")


@pytest.fixture
def client(redis_url: str, catalog: Path) -> FlaskClient:
    return create_app(make_context(redis_url, catalog, admin_token=ADMIN)).test_client()


def _console_flash(client: FlaskClient, model: str, action: str, form: dict[str, str]) -> str:
    """The page the console's action button leads to, with its flashed message."""
    return client.post(f"/actions/{model}/{action}", data={"csrf_token": _login(client), "next": "/fleet", **form},
                       follow_redirects=True).get_data(as_text=True)


# (action, model, form/flags, HTTP status): each a refusal decided by the service
REFUSALS = [
    ("preload", "nope", {}, 404),                        # unknown model
    ("preload", "alpha", {"version": "v9"}, 422),        # unknown version
    ("preload", "alpha", {"gpu": "node-z/cpu:9"}, 422),  # GPU not in the fleet
    ("preload", "alpha", {"gpu": GPU_A}, 409),           # already on that GPU
    ("evict", "gamma", {}, 409),                         # not resident
]


@pytest.mark.parametrize("action, model, form, status", REFUSALS)
def test_a_refusal_reads_the_same_through_the_api_the_console_and_the_cli(
        client: FlaskClient, r: redis.Redis, redis_url: str, catalog: Path, action: str, model: str,
        form: dict[str, str], status: int) -> None:
    publish_gpu(r, GPU_A, replicas=[replica("alpha", GPU_A, "ready")])
    resp = client.post(f"/api/models/{model}/{action}", json=form, headers=AUTH)
    assert resp.status_code == status, resp.get_json()
    words = resp.get_json()["error"]

    flags = [a for k, v in form.items() for a in (f"--{k}", v)]
    p = _cli(redis_url, catalog, action, model, *flags)
    said = (p.stdout if action == "evict" else p.stderr).strip()
    assert said.removeprefix("prewarm: ") == words, p.stdout + p.stderr
    # An evict of a model not resident is already done for the CLI (exit 0, as before); the rest exit 2.
    assert p.returncode == (0 if action == "evict" else 2)

    assert escape(words) in _console_flash(client, model, action, form)
    assert queued_tasks(r, "gpu.node-a.cpu:0") == []  # nothing was sent by any of them


def test_an_evict_from_the_cli_is_marked_as_the_consoles_is(client: FlaskClient, r: redis.Redis,
                                                           redis_url: str, catalog: Path) -> None:
    # It was sent with no kind, so prewarm_evictions_total counted it as reason="unspecified".
    publish_gpu(r, GPU_A, replicas=[replica("alpha", GPU_A, "ready"), replica("beta", GPU_A, "ready")])
    p = _cli(redis_url, catalog, "evict", "alpha")
    assert p.returncode == 0, p.stderr
    assert client.post("/api/models/beta/evict", json={}, headers=AUTH).status_code == 202
    cli_ev, api_ev = events.read(r, model="alpha")[0], events.read(r, model="beta")[0]
    assert (cli_ev.kind, cli_ev.actor) == (api_ev.kind, api_ev.actor) == ("evict", "operator")
    assert cli_ev.numbers["kind"] == api_ev.numbers["kind"] == "operator"
