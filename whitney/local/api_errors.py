"""The server's side of `whitney.errors`: an error as the wire's error object, and a pydantic
failure as the error naming its field."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from whitney.errors import InvalidDatum, InvalidRequest, NotFound, WhitneyError


def error_object(exc: WhitneyError) -> dict[str, Any]:
    """`{"type", "message", "details"}`: what an answer's `error` and an operation's hold."""
    return {"type": exc.type, "message": exc.message, "details": dict(exc.details)}


def not_found(what: str, ident: str) -> NotFound:
    return NotFound(f"{what} {ident!r} not found", details={what.replace(" ", "_"): ident})


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


def from_validation_error(exc: ValidationError, prefix: str = "") -> InvalidRequest | InvalidDatum:
    """The Whitney error for a pydantic failure, naming the first offending field.

    Anything wrong inside `data[i]` of a forward payload is 422 `invalid_datum` with the
    datum's index and the tensor's name; everything else is 400 `invalid_request`.
    """
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:  # pragma: no cover - pydantic always reports one
        return InvalidRequest(f"{prefix or 'body'} is invalid")
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
        return InvalidDatum(f"{path}: {message}", details=details)
    return InvalidRequest(f"{path or 'body'}: {message}", details=details)
