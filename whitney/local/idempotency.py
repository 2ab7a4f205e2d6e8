"""`Idempotency`: a session or run created once per Idempotency-Key and body."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, TypeVar

from pydantic import ValidationError

from whitney import wire
from whitney.errors import IdempotencyConflict, InvalidRequest
from whitney.local.api_errors import from_validation_error
from whitney.local.journal import Journal, canonical_hash

_RequestT = TypeVar("_RequestT", bound=wire.RequestModel)


class Idempotency:
    """Creates resources under Idempotency-Keys recorded in the journal."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._lock = threading.Lock()

    def create_once(
        self,
        tenant: str,
        scope: str,
        model: type[_RequestT],
        body: dict[str, Any],
        idempotency_key: str | None,
        create: Callable[[str, _RequestT], str],
    ) -> str:
        """Validate `body` as `model` and `create(tenant, request)` its resource: the new id,
        or, under an Idempotency-Key used before with the same body, the id that key created."""
        _check_key(idempotency_key)
        try:
            request = model.model_validate(body)
        except ValidationError as exc:
            raise from_validation_error(exc) from None
        body_hash = canonical_hash(request.model_dump(mode="json"))
        with self._lock if idempotency_key else nullcontext():
            existing = self._created(tenant, scope, idempotency_key, body_hash)
            if existing is not None:
                return existing
            resource_id = create(tenant, request)
            if idempotency_key:
                self.journal.put_idempotent(tenant, scope, idempotency_key, body_hash, resource_id)
        return resource_id

    def _created(self, tenant: str, scope: str, key: str | None, body_hash: str) -> str | None:
        """The id `key` created before (with this body), or None."""
        if key is None:
            return None
        record = self.journal.get_idempotent(tenant, scope, key)
        if record is None:
            return None
        if record["body_hash"] != body_hash:
            raise IdempotencyConflict(
                f"Idempotency-Key {key!r} was used before with another body",
                details={"idempotency_key": key},
            )
        return record["resource_id"]


def _check_key(key: str | None) -> None:
    if key is not None and not 1 <= len(key) <= 255:
        raise InvalidRequest(
            "Idempotency-Key must have 1 to 255 characters",
            details={"field": "Idempotency-Key"},
        )
