"""What the client refuses before anything is sent: a request the wire contract refuses, as an
`InvalidRequest` (status None: nothing was sent) naming every refused field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from whitney import wire
from whitney.errors import InvalidRequest


def format_loc(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """A pydantic error location as a field path: `payload.data[0].loss_fn_inputs`."""
    text = prefix
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(root)"


def invalid_request(
    error: ValidationError, what: str, prefix: str = "", limit: int = 5
) -> InvalidRequest:
    """An InvalidRequest (status None: nothing was sent) naming every refused field."""
    problems = [
        {"loc": format_loc(item["loc"], prefix), "msg": item["msg"], "type": item["type"]}
        for item in error.errors(include_url=False, include_input=False, include_context=False)
    ]
    shown = "; ".join(f"{problem['loc']}: {problem['msg']}" for problem in problems[:limit])
    if len(problems) > limit:
        shown += f"; and {len(problems) - limit} more"
    return InvalidRequest(f"invalid {what}: {shown}", details={"errors": problems})


def validated(model: type[BaseModel], body: dict[str, Any], what: str) -> dict[str, Any]:
    """`body`, if `model` accepts it; else the InvalidRequest naming its refused fields."""
    try:
        model.model_validate(body)
    except ValidationError as error:
        problem = invalid_request(error, what)
    else:
        return body
    raise problem


def check_operation(kind: str, payload: Any, sampler_id: str | None) -> None:
    """Refuse an operation the wire contract refuses: its route, its kind, its payload."""
    if sampler_id is None and kind not in wire.RUN_OPERATION_KINDS:
        if kind in wire.SAMPLER_OPERATION_KINDS:
            raise InvalidRequest(
                f"{kind!r} is a sampler operation: it needs a sampler_id (sampler_operation)"
            )
        raise InvalidRequest(
            f"unknown operation kind {kind!r} "
            f"(run operations: {', '.join(sorted(wire.RUN_OPERATION_KINDS))})"
        )
    if sampler_id is not None and kind not in wire.SAMPLER_OPERATION_KINDS:
        raise InvalidRequest(
            f"{kind!r} is not a sampler operation "
            f"(sampler operations: {', '.join(sorted(wire.SAMPLER_OPERATION_KINDS))})"
        )
    if sampler_id is not None and (not isinstance(sampler_id, str) or not sampler_id):
        raise InvalidRequest(f"sampler_id must be a non-empty string, got {sampler_id!r}")
    if not isinstance(payload, Mapping):
        raise InvalidRequest(f"payload must be a dict, got {type(payload).__name__}")
    try:
        wire.validate_payload(kind, dict(payload))
    except ValidationError as error:
        problem = invalid_request(error, f"{kind} payload", prefix="payload")
    else:
        return
    raise problem
