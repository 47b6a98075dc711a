"""`GET /openapi.json`: an OpenAPI 3.1 description of the hooks and the JSON API.

Request bodies come from the pydantic models the views validate with (`web.schemas`), so the description
cannot drift from what is accepted. The fuzz test (tests/test_web_security.py) runs schemathesis against it.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue
from pydantic.json_schema import models_json_schema

from prewarm.domain import states as rs
from prewarm.store.eta_promises import KEPT as ETA_KEPT
from web.schemas import MAX_BATCH, EvictBody, PreloadBody, RequestBatch, RequestEvent, Rollout

bp = Blueprint("openapi", __name__)

_ERROR = {"$ref": "#/components/schemas/Error"}
_MODEL_ID = {"type": "string", "minLength": 1, "maxLength": 128}


def _resp(desc: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": schema or {"type": "object"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    words = {400: "malformed request", 401: "missing or wrong credentials", 403: "forbidden (CSRF or actions "
             "disabled)", 404: "unknown model or version", 409: "conflicts with the fleet's state",
             413: "batch or body too large", 415: "not JSON", 422: "invalid field (named in the message)",
             429: "too many failed tries of the token (see Retry-After)", 503: "Redis is unavailable"}
    return {str(c): _resp(words[c], _ERROR) for c in (*codes, 503)}


def _action(summary: str, body: type | None) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary, "security": [{"adminToken": []}],
        "parameters": [{"name": "model", "in": "path", "required": True, "schema": _MODEL_ID}],
        "responses": {"200": _resp("done"), "202": _resp("queued on the GPU's queue"),
                      **_errors(400, 401, 403, 404, 409, 413, 415, 422, 429)},
    }
    if body is not None:
        op["requestBody"] = {"required": False, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{body.__name__}"}}}}
    return op


def _node_action(summary: str) -> dict[str, Any]:
    return {
        "summary": summary, "security": [{"adminToken": []}],
        "parameters": [{"name": "node", "in": "path", "required": True,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 253}}],
        "requestBody": {"required": False, "content": {"application/json": {"schema": {
            "type": "object", "properties": {"reason": {"type": "string", "maxLength": 500}}}}}},
        "responses": {"200": _resp("done"), "202": _resp("draining"),
                      **_errors(400, 401, 403, 404, 413, 415, 422, 429)},
    }


def spec() -> dict[str, Any]:
    _, defs = models_json_schema([(m, "validation") for m in (RequestEvent, RequestBatch, Rollout, PreloadBody,
                                                               EvictBody)],
                                 ref_template="#/components/schemas/{model}")
    schemas = dict(defs.get("$defs", {}))
    schemas["Error"] = {"type": "object", "required": ["error"],
                        "properties": {"error": {"type": "string", "minLength": 1},
                                       "field": {"type": "string"}}}
    hook_sec = [{"hookToken": []}]
    paths: dict[str, Any] = {
        "/hooks/requests": {"post": {
            "summary": f"Report requests: one event or a batch of up to {MAX_BATCH}; all-or-nothing",
            "security": hook_sec,
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": [
                {"$ref": "#/components/schemas/RequestEvent"}, {"$ref": "#/components/schemas/RequestBatch"}]}}}},
            "responses": {"202": _resp("recorded", {"type": "object", "required": ["accepted", "requests"],
                                                   "properties": {"accepted": {"type": "integer"},
                                                                  "requests": {"type": "integer"}}}),
                          **_errors(400, 401, 413, 415, 422, 429)}}},
        "/hooks/route": {"get": {
            "summary": "Where is the model warm? Ready replicas first; a cold model gets one on-demand preload",
            "security": hook_sec,
            "parameters": [{"name": "model", "in": "query", "required": True, "schema": _MODEL_ID},
                           {"name": "version", "in": "query", "required": False, "schema": _MODEL_ID},
                           {"name": "retry", "in": "query", "required": False, "schema": {"enum": ["0", "1"]},
                            "description": "1: a repeat lookup while waiting; not counted in the hit rate"},
                           {"name": "priority", "in": "query", "required": False,
                            "schema": {"enum": ["high", "normal", "low"]},
                            "description": "the on-demand preload's place in the GPU's load queue; default: "
                                           "the model's catalog priority"}],
            "responses": {"200": _resp("the model's state and replicas", {
                "type": "object", "required": ["model", "version", "state", "replicas"],
                "properties": {"model": {"type": "string"}, "version": {"type": "string"},
                               "state": {"enum": list(rs.ROUTE_STATES)},
                               "replicas": {"type": "array", "items": {"type": "object"}},
                               "preload": {"type": "object"},
                               "eta_seconds": {"type": "number", "minimum": 0,
                                               "description": "loading/cold: seconds until the first replica "
                                                              "is ready (also the Retry-After header)"},
                               "fallback": {"type": "object", "required": ["model", "version", "replicas"],
                                            "description": "loading/cold with a catalog fallback: its ready "
                                                           "replicas"},
                               "base": {"type": "string",
                                        "description": "a LoRA adapter: the catalog id of the base it is served "
                                                       "from; each replica then has `model` (the adapter's name "
                                                       "in the OpenAI request) and `host` (the base replica)"},
                               "base_eta_seconds": {"type": "number", "minimum": 0,
                                                    "description": "an adapter with no base replica ready: the "
                                                                   "base's part of eta_seconds"}}}),
                          **_errors(400, 401, 404, 429)}}},
        "/hooks/rollout": {"post": {
            "summary": "A new version is about to take a share of the model's traffic: warm it first",
            "security": hook_sec,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Rollout"}}}},
            "responses": {"202": _resp("stored for the scheduler"), **_errors(400, 401, 413, 415, 422, 429)}}},
        "/healthz": {"get": {"summary": "Liveness and Redis reachability", "security": [],
                             "responses": {"200": _resp("ok"), **_errors()}}},
        "/api/fleet": {"get": {"summary": "Every GPU with memory split and replicas; stale GPUs flagged",
                               "security": [], "responses": {"200": _resp("the fleet"), **_errors()}}},
        "/api/models": {"get": {
            "summary": "Every catalog model with rate, totals, replicas, cold starts, load times, sparkline",
            "security": [],
            "parameters": [{"name": "window", "in": "query", "required": False,
                            "schema": {"type": "number", "minimum": 1, "maximum": 604800}}],
            "responses": {"200": _resp("the models"), **_errors(400)}}},
        "/api/events": {"get": {
            "summary": "The decision log, newest first", "security": [],
            "parameters": [{"name": n, "in": "query", "required": False, "schema": {"type": "string", "maxLength": 200}}
                           for n in ("model", "gpu", "actor", "kind")]
            + [{"name": "limit", "in": "query", "required": False,
                "schema": {"type": "integer", "minimum": 1, "maximum": 2000}}],
            "responses": {"200": _resp("events"), **_errors(400)}}},
        "/api/roi": {"get": {
            "summary": "Per model over a window: GPU memory-time held (GiB·h), warm hits, cold starts, cold "
                       "starts avoided by loads ahead of demand, cost at PREWARM_GPU_HOUR_COST",
            "security": [],
            "parameters": [{"name": "window", "in": "query", "required": False,
                            "schema": {"type": "integer", "minimum": 60, "maximum": 86400}}],
            "responses": {"200": _resp("the return on warmth", {
                "type": "object", "required": ["window_seconds", "gpu_hour_cost", "models"],
                "properties": {"window_seconds": {"type": "integer"}, "gpu_hour_cost": {"type": "number"},
                               "models": {"type": "array", "items": {
                                   "type": "object", "required": ["id", "gpu_memory_gib_hours", "warm_hits",
                                                                  "cold_starts", "cold_starts_avoided", "cost"]}},
                               "totals": {"type": "object"}}}), **_errors(400)}}},
        "/api/eta": {"get": {
            "summary": f"How the route hook's ETA promises held: real − promised seconds of the last {ETA_KEPT:,} "
                       "closed promises (median, p95, mean |error|) and the newest ones",
            "security": [],
            "parameters": [{"name": "limit", "in": "query", "required": False,
                            "schema": {"type": "integer", "minimum": 0, "maximum": ETA_KEPT}}],
            "responses": {"200": _resp("ETA error", {
                "type": "object", "required": ["count", "kept", "error_seconds", "recent"],
                "properties": {"count": {"type": "integer"}, "kept": {"type": "integer"},
                               "error_seconds": {"type": ["object", "null"]},
                               "recent": {"type": "array", "items": {"type": "object"}}}}), **_errors(400)}}},
        "/api/models/{model}/preload": {"post": _action("Preload the model onto a GPU (default: most free)",
                                                        PreloadBody)},
        "/api/models/{model}/evict": {"post": _action("Evict the model (from every GPU unless gpu is given)",
                                                      EvictBody)},
        "/api/models/{model}/pin": {"post": _action("Pin the model: never evicted", None)},
        "/api/models/{model}/unpin": {"post": _action("Unpin the model", None)},
        "/api/nodes/{node}/drain": {
            "post": _node_action("Drain the node: no new preloads; its replicas with demand are loaded elsewhere "
                                 "first, then evicted, and its worker exits (202; 200: draining already)"),
            "delete": _node_action("Undo the node's drain: it takes new preloads again")},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "prewarm", "version": "1",
                 "description": "Hooks for the request router and the admin JSON API of prewarm."},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {
            "hookToken": {"type": "http", "scheme": "bearer",
                          "description": "PREWARM_HOOK_TOKEN (required only when it is set)"},
            "adminToken": {"type": "http", "scheme": "bearer", "description": "PREWARM_ADMIN_TOKEN"}}},
    }


@bp.get("/openapi.json")
def openapi_json() -> ResponseReturnValue:
    return jsonify(spec())
