"""The Whitney error hierarchy: one class per error type of docs/api.md, each with its wire
`type` and the HTTP `status` Whitney answers it with. The client meets HTTP at one boundary,
its transport (`whitney.transport`), which types every answer by them (`error_for`); the
embedded server raises them and answers each with its status."""

from __future__ import annotations

from typing import Any


class WhitneyError(Exception):
    """Any failure talking to Whitney; `retryable` says whether resending the same call is safe.

    On a class, `status` is the HTTP status Whitney answers that type with; on an error, the
    status of the answer that carried it (None when no answer did: the client refused itself).
    """

    type: str = "error"
    status: int | None = None
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        if type is not None:
            self.type = type
        self.details = dict(details or {})
        self.retry_after = retry_after

    def __str__(self) -> str:
        prefix = f"{self.status} " if self.status is not None else ""
        return f"{prefix}{self.type}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, type={self.type!r}, "
            f"message={self.message!r})"
        )


class TransportError(WhitneyError):
    """The request never got an answer: connection refused or dropped, or a timeout."""

    type = "transport_error"
    retryable = True


class InvalidRequest(WhitneyError):
    type = "invalid_request"
    status = 400


class Unauthorized(WhitneyError):
    type = "unauthorized"
    status = 401


class NotFound(WhitneyError):
    type = "not_found"
    status = 404


class Conflict(WhitneyError):
    """A 409: the call conflicts with the run's state or its journal."""

    type = "conflict"
    status = 409


class SeqConflict(Conflict):
    type = "seq_conflict"


class SeqGap(Conflict):
    type = "seq_gap"


class RunNotActive(Conflict):
    type = "run_not_active"


class IdempotencyConflict(Conflict):
    type = "idempotency_conflict"


class PayloadTooLarge(WhitneyError):
    """A request body over the server's `max_body_bytes`."""

    type = "payload_too_large"
    status = 413


class Unprocessable(WhitneyError):
    """A 422: the payload is well formed but the provider refuses it."""

    type = "unprocessable"
    status = 422


class InvalidDatum(Unprocessable):
    type = "invalid_datum"


class UnsupportedLoss(Unprocessable):
    type = "unsupported_loss"


class InvalidLossConfig(Unprocessable):
    type = "invalid_loss_config"


class UnsupportedBaseModel(Unprocessable):
    """A base model the provider does not serve (or, for `hf:` models, has not cached)."""

    type = "unsupported_base_model"


class LimitExceeded(Unprocessable):
    """A request over one of the server's limits (capabilities `limits`); details name the
    field, the limit and the value."""

    type = "limit_exceeded"


class NonFiniteResult(Unprocessable):
    """The operation would have produced a non-finite loss, gradient, weight or logprob; it
    failed and the run's state is what it was before it."""

    type = "non_finite"


class OperationCancelled(WhitneyError):
    """The operation's run was cancelled (or its session closed) before it ended."""

    type = "cancelled"
    status = 409


class RateLimited(WhitneyError):
    type = "rate_limited"
    status = 429
    retryable = True


class ServerError(WhitneyError):
    """A 5xx answer; the same call may be resent."""

    type = "internal"
    status = 500
    retryable = True


class InternalError(ServerError):
    type = "internal"


class Unavailable(ServerError):
    type = "unavailable"
    status = 503


class OperationFailed(WhitneyError):
    """The operation was accepted and executed, but ended `failed` or `cancelled`."""

    type = "operation_failed"


class OperationTimeout(WhitneyError):
    """An operation or run did not reach a terminal status within the caller's bound."""

    type = "operation_timeout"
    retryable = True


ERRORS_BY_TYPE: dict[str, type[WhitneyError]] = {
    cls.type: cls
    for cls in (
        InvalidRequest,
        Unauthorized,
        NotFound,
        SeqConflict,
        SeqGap,
        RunNotActive,
        IdempotencyConflict,
        PayloadTooLarge,
        InvalidDatum,
        UnsupportedLoss,
        InvalidLossConfig,
        UnsupportedBaseModel,
        LimitExceeded,
        NonFiniteResult,
        OperationCancelled,
        RateLimited,
        InternalError,
        Unavailable,
    )
}

ERRORS_BY_STATUS: dict[int, type[WhitneyError]] = {
    cls.status: cls
    for cls in (
        InvalidRequest,
        Unauthorized,
        NotFound,
        Conflict,
        PayloadTooLarge,
        Unprocessable,
        RateLimited,
    )
}
"""Each 4xx status to the most general class answered with it (a 5xx is a ServerError)."""


def error_for(
    status: int,
    type: str | None,
    message: str,
    details: dict[str, Any] | None = None,
    retry_after: float | None = None,
) -> WhitneyError:
    """The typed error for an HTTP status and an error body's `type`."""
    cls = ERRORS_BY_TYPE.get(type or "")
    if cls is None:
        cls = ERRORS_BY_STATUS.get(status, ServerError if status >= 500 else WhitneyError)
    return cls(message, status=status, type=type, details=details, retry_after=retry_after)
