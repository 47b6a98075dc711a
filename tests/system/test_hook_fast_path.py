"""web.hook_wsgi: `POST /hooks/requests` answered before Flask when plainly fine, and handed to the Flask view
(with its body) for everything else, against a real Redis."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from flask import request

from prewarm import keys, traffic
from tests.web_support import make_catalog, make_context
from web.app import create_app
from web.util import SECURITY_HEADERS


@pytest.fixture
def app_and_views(redis_url: str, tmp_path: Path):  # noqa: ANN201
    app = create_app(make_context(redis_url, make_catalog(tmp_path / "models")))
    seen: list[str] = []  # every request Flask itself handled
    app.before_request(lambda: seen.append(request.path))
    return app, seen


def test_a_plainly_valid_post_is_answered_before_flask_with_the_headers_every_answer_carries(
        app_and_views, r: redis.Redis) -> None:  # noqa: ANN001
    app, seen = app_and_views
    c = app.test_client()
    one = c.post("/hooks/requests", json={"model": "alpha", "count": 3})
    batch = c.post("/hooks/requests", json={"events": [{"model": "beta"}, {"model": "alpha"}, {"model": "beta"}]},
                   headers={"Content-Type": "application/json; charset=utf-8"})
    assert (one.status_code, one.get_data()) == (202, b'{"accepted":1,"requests":3}\n')
    assert (batch.status_code, batch.get_data()) == (202, b'{"accepted":3,"requests":3}\n')
    for resp in (one, batch):
        assert resp.mimetype == "application/json"
        assert all(resp.headers[k] == v for k, v in SECURITY_HEADERS)
    assert seen == []  # Flask never saw them
    assert traffic.totals(r) == {"alpha": 4, "beta": 2}
    assert c.get("/healthz").status_code == 200 and seen == ["/healthz"]  # the same app's other routes


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"model": "nope"}, 422, "model"),  # unknown model: the view's words
    ({"events": [{"model": "alpha"}, {"model": "alpha", "count": -1}]}, 422, "events[1].count"),
    ({"model": "alpha", "extra": 1}, 422, "extra"),
])
def test_anything_else_reaches_the_view_with_its_body_and_records_nothing(
        app_and_views, r: redis.Redis, body: dict, status: int, field: str) -> None:  # noqa: ANN001
    app, seen = app_and_views
    resp = app.test_client().post("/hooks/requests", json=body)
    assert resp.status_code == status and resp.get_json().get("field") == field, resp.get_json()
    assert seen == ["/hooks/requests"] and traffic.totals(r) == {}


def test_malformed_json_and_a_wrong_token_are_the_views_to_answer(redis_url: str, tmp_path: Path,
                                                                   r: redis.Redis) -> None:
    ctx = make_context(redis_url, make_catalog(tmp_path / "models"), hook_token="s3cret")
    c = create_app(ctx).test_client()
    bad = c.post("/hooks/requests", data=b'{"model": "alpha"', content_type="application/json",
                 headers={"Authorization": "Bearer s3cret"})
    assert bad.status_code == 400 and bad.get_json()["error"] == "body: malformed JSON"
    wrong = c.post("/hooks/requests", json={"model": "alpha"}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"]
    ok = c.post("/hooks/requests", json={"model": "alpha"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 202 and traffic.totals(r) == {"alpha": 1}


def test_a_write_redis_refuses_is_the_apps_503_and_is_not_tried_again(app_and_views, r: redis.Redis) -> None:  # noqa: ANN001
    app, seen = app_and_views
    r.set(keys.LAST_REQUEST, "not a sorted set")  # the record script's ZADD fails after its HINCRBYs
    resp = app.test_client().post("/hooks/requests", json={"model": "alpha", "count": 5})
    assert resp.status_code == 503 and "Redis is unavailable" in resp.get_json()["error"]
    assert seen == ["/hooks/requests"]  # answered by the app's own error handler
    # Redis runs a script's commands until the failing one: the one try's counts, not two tries' (10)
    assert traffic.totals(r) == {"alpha": 5}
