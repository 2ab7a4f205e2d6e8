"""The one exception the engine raises for a request it refuses."""

from __future__ import annotations


class EngineError(Exception):
    """A request the engine refuses; `type` is a whitney-api.md error type (e.g. "invalid_datum",
    "unsupported_loss", "invalid_loss_config", "invalid_request", "not_found")."""

    def __init__(self, type: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.type = type
        self.message = message
        self.details = dict(details or {})
