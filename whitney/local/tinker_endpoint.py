"""A Tinker endpoint as the forwarding provider (`whitney.local.tinker_provider`) reaches it:
its URL, whether it accepts a connection, its failures as Whitney's errors (one line naming
the endpoint, never the key), and Whitney's payloads in the SDK's shapes."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from whitney.errors import InvalidRequest, NotFound, Unavailable, WhitneyError

TINKER_URL_ENV = "TINKER_BASE_URL"
"""The endpoint of the server `whitney-flows run` starts (as the SDK names it)."""
REACH_TIMEOUT_S = 5.0
"""How long the endpoint may take to accept a connection before the run's creation fails."""
CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")
"""The per-token tensors Tinker takes as scalars of `loss_fn_config`."""


def endpoint_of(url: str) -> str:
    """The endpoint a run's records name: the URL without credentials, query or fragment."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s) URL, got {url[:200]!r}")
    host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def reach(url: str, endpoint: str) -> None:
    """Fail in one line unless the endpoint accepts a TCP connection (the SDK itself would
    retry a refused connection for minutes)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise Unavailable(
            f"tinker endpoint {endpoint} is unreachable ({type(exc).__name__}): the run is "
            "not moved to the CPU engine",
            details={"endpoint": endpoint},
        ) from None


def provider_error(endpoint: str, exc: BaseException) -> WhitneyError:
    """A Tinker SDK failure as one line naming the endpoint: 4xx as the refusal it is (its
    message), anything else (unreachable, 5xx after the SDK's retries) as 503."""
    import tinker

    if isinstance(exc, WhitneyError):
        return exc
    status = getattr(exc, "status_code", None)
    if isinstance(exc, tinker.APIStatusError) and status is not None and 400 <= status < 500:
        message = _message(exc)
        if status == 404:
            return NotFound(f"tinker endpoint {endpoint}: {message}")
        return InvalidRequest(f"tinker endpoint {endpoint}: {message}", details={"status": status})
    reason = type(exc).__name__ if status is None else f"HTTP {status}"
    return Unavailable(
        f"tinker endpoint {endpoint} failed ({reason}): the run is not moved to the CPU engine",
        details={"endpoint": endpoint},
    )


def _message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"].splitlines()[0][:500]
    return str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__


def clip_config(data: list[dict[str, Any]]) -> dict[str, float]:
    """The per-token clip tensors as Tinker's scalar `loss_fn_config` (Tinker takes one clip
    range per request); a clip range that varies is refused, naming the tensor."""
    config: dict[str, float] = {}
    for name in CLIP_KEYS:
        values = {
            float(v) for datum in data for v in datum["loss_inputs"].get(name, {}).get("values", [])
        }
        if len(values) > 1:
            raise InvalidRequest(
                f"loss_inputs.{name}: the tinker provider takes one clip value per request "
                "(Tinker's loss_fn_config), not one per token",
                details={"field": f"loss_inputs.{name}"},
            )
        config |= {name: values.pop()} if values else {}
    return config


def tinker_datum(datum: dict[str, Any], drop: Any = ()) -> Any:
    """A Whitney datum as a `tinker.types.Datum`, without the inputs named in `drop`."""
    from tinker import types

    inputs = {
        name: types.TensorData(data=tensor["values"], dtype=tensor["dtype"], shape=tensor["shape"])
        for name, tensor in datum["loss_inputs"].items()
        if name not in drop
    }
    ids = tokens(datum["input"])
    return types.Datum(model_input=types.ModelInput.from_ints(ids), loss_fn_inputs=inputs)


def tokens(model_input: dict[str, Any]) -> list[int]:
    """The token ids of a Whitney ModelInput."""
    tokens = model_input.get("token_ids")
    if not isinstance(tokens, list):
        raise InvalidRequest("input: the tinker provider takes token_ids only")
    return [int(token) for token in tokens]
