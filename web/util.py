"""Small helpers shared by the blueprints: the process context, JSON errors, validated bodies."""

from __future__ import annotations

from typing import Any, TypeVar

from flask import current_app, jsonify, request
from flask.typing import ResponseReturnValue
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge

from prewarm.context import Context
from web.schemas import describe, expected_body

M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """A client error with a message naming the field; rendered as JSON `{"error", "field"}`."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers or {}  # e.g. Retry-After on a 429


def ctx() -> Context:
    return current_app.extensions["prewarm"]


# Headers every answer carries (the app's after_request, and the hook answered before Flask: web.hook_wsgi).
SECURITY_HEADERS = (("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"),
                    ("Referrer-Policy", "same-origin"))


def json_error(status: int, message: str, field: str | None = None,
               headers: dict[str, str] | None = None) -> ResponseReturnValue:
    body: dict[str, Any] = {"error": message}
    if field:
        body["field"] = field
    return jsonify(body), status, headers or {}


DRAIN_FACTOR = 4  # read at most this many limits of an oversize chunked body, so the client sees the 413


def enforce_body_limit() -> None:
    """413 for a chunked body (no Content-Length) larger than MAX_CONTENT_LENGTH.

    werkzeug answers 413 for a Content-Length over the limit, but stops reading a chunked body at the
    limit without saying so: the view would get it cut short (a JSON batch then reads as "malformed").
    So such a body is read here, once (cached for get_json and form parsing), and looked past.
    """
    limit = request.max_content_length
    if limit is None or request.content_length is not None \
            or "chunked" not in request.headers.get("Transfer-Encoding", "").lower():
        return
    if len(request.get_data(cache=True)) < limit:
        return
    raw = request.input_stream  # the server's own stream, past werkzeug's limit
    extra = raw.read(1)
    if not extra:
        return  # exactly at the limit
    drained = 0  # the rest is discarded, up to a bound: a client still sending would see a reset instead
    while extra and drained < DRAIN_FACTOR * limit:
        extra = raw.read(64 * 1024)
        drained += len(extra)
    raise RequestEntityTooLarge()


def json_body() -> Any:
    """The request's JSON value, or ApiError 415 (not JSON) / 400 (malformed JSON).

    An empty body and a JSON `null` both come back as None: `validate` then answers 400 naming the object
    it expects (a `null` is well-formed, so "malformed JSON" would send the client looking in the wrong place).
    """
    raw = request.get_data(cache=True)  # a chunked body past the limit was answered 413 before the view
    if not raw:
        return None
    if not request.is_json:
        raise ApiError(415, "body: send Content-Type: application/json", "body")
    try:
        return request.get_json()
    except (BadRequest, RecursionError):  # RecursionError: absurdly deep nesting
        raise ApiError(400, "body: malformed JSON", "body") from None


_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def validate(model: type[M], data: Any) -> M:
    if data is None:
        raise ApiError(400, f"body: a JSON object {expected_body(model)} is required", "body")
    if not isinstance(data, dict):
        raise ApiError(422, f"body: must be a JSON object {expected_body(model)}, not "
                            f"{_JSON_KINDS.get(type(data), 'that')}", "body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        field, message = describe(exc)
        raise ApiError(422, message, field) from None
