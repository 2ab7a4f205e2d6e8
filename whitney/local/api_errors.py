"""The server's error: an HTTP status and the whitney-api.md error body."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

STATUS_BY_TYPE: dict[str, int] = {
    "invalid_request": 400,
    "unauthorized": 401,
    "not_found": 404,
    "seq_conflict": 409,
    "seq_gap": 409,
    "run_not_active": 409,
    "idempotency_conflict": 409,
    "invalid_datum": 422,
    "unsupported_loss": 422,
    "invalid_loss_config": 422,
    "unsupported_base_model": 422,  # the engine's type for a base model it cannot load
    "rate_limited": 429,
    "internal": 500,
    "unavailable": 503,
}


class ApiError(Exception):
    """A refusal the client sees as `{"error": {"type", "message", "details"}}` with `status`."""

    def __init__(
        self,
        type: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.type = type
        self.message = message
        self.details = dict(details or {})
        self.status = status if status is not None else STATUS_BY_TYPE.get(type, 400)
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": self.as_error()}

    def as_error(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "details": self.details}


def not_found(what: str, ident: str) -> ApiError:
    return ApiError("not_found", f"{what} {ident!r} not found", {what.replace(" ", "_"): ident})


def _field_path(loc: tuple[Any, ...], prefix: str) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("list[int]", "list[float]") or str(part).startswith(("list[", "function-")):
            # pydantic names union branches in the location; they are not fields
            continue
        else:
            path = f"{path}.{part}" if path else str(part)
    return path


def _tensor_name(loc: tuple[Any, ...], message: str) -> str | None:
    parts = list(loc)
    if "loss_inputs" in parts:
        index = parts.index("loss_inputs")
        if index + 1 < len(parts) and isinstance(parts[index + 1], str):
            return parts[index + 1]
    if message.startswith("loss_inputs."):
        return message.removeprefix("loss_inputs.").split(" ", 1)[0]
    if "input" in parts:
        return "token_ids"
    return None


def from_validation_error(exc: ValidationError, prefix: str = "") -> ApiError:
    """The Whitney error for a pydantic failure, naming the first offending field.

    Anything wrong inside `data[i]` of a forward payload is 422 `invalid_datum` with the
    datum's index and the tensor's name; everything else is 400 `invalid_request`.
    """
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:  # pragma: no cover - pydantic always reports one
        return ApiError("invalid_request", f"{prefix or 'body'} is invalid")
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    path = _field_path(loc, prefix)
    details: dict[str, Any] = {"field": path, "errors": len(errors)}
    if len(loc) >= 2 and loc[0] == "data" and isinstance(loc[1], int):
        datum = loc[1]
        path = _field_path(loc, "")  # "data[i]...", as whitney.losses words it
        details["field"] = path
        tensor = _tensor_name(loc[2:], message)
        details["datum"] = datum
        if tensor is not None:
            details["tensor"] = tensor
        return ApiError("invalid_datum", f"{path}: {message}", details)
    return ApiError("invalid_request", f"{path or 'body'}: {message}", details)
