"""The OpenAPI 3.1 document of the embedded Whitney (`GET /openapi.json`), from the wire models.

FastAPI sees the routes' path and query parameters; the handlers read their bodies from the
raw request, so the request bodies, the answers and the error body are added here from
`whitney.wire`, with pydantic's `$defs` as `components/schemas`. An operation's body is one
variant per kind: `kind` a constant and `payload` that kind's model.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from whitney import wire

REF = "#/components/schemas/{model}"
BEARER = "bearer"

RESPONSES: dict[tuple[str, str], type[BaseModel]] = {
    ("get", "/v1/training/capabilities"): wire.Capabilities,
    ("post", "/v1/sessions"): wire.Session,
    ("get", "/v1/sessions"): wire.SessionList,
    ("get", "/v1/sessions/{session_id}"): wire.Session,
    ("post", "/v1/sessions/{session_id}/close"): wire.Session,
    ("post", "/v1/sessions/{session_id}/heartbeat"): wire.Session,
    ("post", "/v1/training/runs"): wire.Run,
    ("get", "/v1/training/runs/{run_id}"): wire.Run,
    ("post", "/v1/training/runs/{run_id}/finish"): wire.Run,
    ("post", "/v1/training/runs/{run_id}/cancel"): wire.Run,
    ("post", "/v1/training/runs/{run_id}/operations"): wire.Operation,
    ("post", "/v1/training/runs/{run_id}/samplers/{sampler_id}/operations"): wire.Operation,
    ("get", "/v1/training/runs/{run_id}/operations/{seq_id}"): wire.Operation,
    ("get", "/v1/training/runs/{run_id}/operations"): wire.OperationList,
}
"""The model of each route's 200 answer (the artifact route answers a tar archive)."""

BODIES: dict[tuple[str, str], type[BaseModel] | tuple[str, ...]] = {
    ("post", "/v1/sessions"): wire.SessionCreate,
    ("post", "/v1/training/runs"): wire.RunCreate,
    ("post", "/v1/training/runs/{run_id}/operations"): wire.RUN_OPERATIONS,
    ("post", "/v1/training/runs/{run_id}/samplers/{sampler_id}/operations"): (
        wire.SAMPLER_OPERATIONS
    ),
}
"""Each POST route's body: a request model, or the operation kinds it takes."""

IDEMPOTENT = frozenset({("post", "/v1/sessions"), ("post", "/v1/training/runs")})

LABEL_QUERY: dict[str, Any] = {
    "name": "label",
    "in": "query",
    "required": False,
    "description": "KEY:VALUE; only the sessions bearing every label given",
    "schema": {"type": "array", "items": {"type": "string"}},
    "style": "form",
    "explode": True,
}


def install(app: FastAPI) -> None:
    """Make `app.openapi()` (what `openapi_url` serves) answer `document(app)`, built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of `app`'s routes, with the wire's bodies, answers and errors."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = _wire_schemas()
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            _complete(operation, method, path)
    doc["components"] = {
        "schemas": schemas,
        "securitySchemes": {BEARER: {"type": "http", "scheme": "bearer"}},
    }
    doc["security"] = [{BEARER: []}]
    return doc


def _wire_schemas() -> dict[str, Any]:
    """The JSON schema of every wire model the document names, keyed by model name."""
    models = {*RESPONSES.values(), wire.ErrorBody}
    models |= {body for body in BODIES.values() if isinstance(body, type)}
    models |= {wire.PAYLOAD_MODELS[kind] for kind in wire.PAYLOAD_MODELS}
    pairs = [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)]
    _, top = models_json_schema(pairs, ref_template=REF)
    return dict(sorted(top["$defs"].items()))


def _complete(operation: dict[str, Any], method: str, path: str) -> None:
    """Give one path operation its body, extra parameters, answers and error body."""
    key = (method, path)
    if path == "/v1/sessions" and method == "get":
        operation.setdefault("parameters", []).append(LABEL_QUERY)
    if key in IDEMPOTENT:
        operation.setdefault("parameters", []).append(_header("Idempotency-Key"))
    if key in BODIES:
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": _body_schema(BODIES[key])}},
        }
    operation["responses"] = {"200": _success(key), **_errors()}


def _header(name: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": {"type": "string"}}


def _body_schema(body: type[BaseModel] | tuple[str, ...]) -> dict[str, Any]:
    if isinstance(body, type):
        return _ref(body)
    return {"oneOf": [_operation_variant(kind) for kind in body]}


def _operation_variant(kind: str) -> dict[str, Any]:
    """`OperationRequest` with `kind` fixed and `payload` that kind's model."""
    seq_id = wire.OperationRequest.model_json_schema()["properties"]["seq_id"]
    return {
        "title": f"OperationRequest[{kind}]",
        "type": "object",
        "properties": {
            "seq_id": seq_id,
            "kind": {"const": kind},
            "payload": _ref(wire.PAYLOAD_MODELS[kind]),
        },
        "required": ["seq_id", "kind"],
        "additionalProperties": False,
    }


def _success(key: tuple[str, str]) -> dict[str, Any]:
    model = RESPONSES.get(key)
    if model is None:
        content = {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}
        return {"description": "the archive's bytes", "content": content}
    return {"description": model.__name__, "content": {"application/json": {"schema": _ref(model)}}}


def _errors() -> dict[str, Any]:
    """Every refusal is the wire's error body."""
    answer = {"content": {"application/json": {"schema": _ref(wire.ErrorBody)}}}
    return {
        "4XX": {"description": "a refusal naming its field", **answer},
        "5XX": {"description": "the server failed or is unavailable", **answer},
    }


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": REF.format(model=model.__name__)}
