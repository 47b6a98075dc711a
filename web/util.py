"""Small helpers shared by the blueprints: the process context, JSON errors, validated bodies."""

from __future__ import annotations

from typing import Any, TypeVar

from flask import current_app, jsonify, request
from flask.typing import ResponseReturnValue
from pydantic import BaseModel, ValidationError

from prewarm.context import Context
from web.schemas import describe

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


def json_error(status: int, message: str, field: str | None = None,
               headers: dict[str, str] | None = None) -> ResponseReturnValue:
    body: dict[str, Any] = {"error": message}
    if field:
        body["field"] = field
    return jsonify(body), status, headers or {}


def json_body() -> Any:
    """The request's JSON, or ApiError 400/415 naming what is wrong with it."""
    if request.content_length and not request.is_json:
        raise ApiError(415, "body: send Content-Type: application/json", "body")
    if not request.get_data(cache=True):
        raise ApiError(400, "body: a JSON object is required", "body")
    try:
        data = request.get_json(silent=True)
    except RecursionError:  # absurdly deep nesting: not a ValueError, so not caught by `silent`
        data = None
    if data is None:
        raise ApiError(400, "body: malformed JSON", "body")
    return data


def validate(model: type[M], data: Any) -> M:
    if not isinstance(data, dict):
        raise ApiError(422, "body: must be a JSON object", "body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        field, message = describe(exc)
        raise ApiError(422, message, field) from None
