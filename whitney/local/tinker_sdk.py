"""The one place the forwarding provider reaches past the `tinker` SDK's public API. The SDK
numbers a training client's requests itself (`seq_id` = request id + 1, counted from 0 by each
new client) and offers no public way to read that number or to open a client on an existing
model at a given number; resending an operation under its recorded Tinker seq_id after a
broker restart needs both. Pinned to the SDK version below by
tests/tinker/test_provider_sdk_adapter.py, which fails when the SDK changes them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PINNED_SDK = "0.38.0"
"""The `tinker` version whose private attributes `Position` and `client_at` use."""
CONNECT_TIMEOUT_S = 20.0
"""How long fetching the model's info may take when a client is opened on it again."""


@dataclass(frozen=True)
class Position:
    """Where a training client is: its model (and session) and the id of its next request."""

    session_id: str
    model_id: str
    model_seq_id: int
    next_request_id: int

    def at(self, request_id: int) -> Position:
        return Position(self.session_id, self.model_id, self.model_seq_id, request_id)

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def position(service: Any, training: Any) -> Position:
    """The training client's position (its `service`'s session)."""
    return Position(
        session_id=str(service.holder.get_session_id()),
        model_id=str(training.model_id),
        model_seq_id=int(training._training_client_id),
        next_request_id=int(training._request_id_counter),
    )


def client_at(url: str, where: Position, session: Any | None = None) -> tuple[Any, Any]:
    """A training client on `where`'s model whose next request goes out under
    `where.next_request_id`, and the ServiceClient of its session: `session` (live) or, without
    one, a ServiceClient on the model's session again (heartbeats resume; `close` ends it)."""
    import tinker
    from tinker.lib.internal_client_holder import InternalClientHolder
    from tinker.lib.public_interfaces.training_client import fetch_training_info

    if session is None:
        session = tinker.ServiceClient(base_url=url)
        session._session_holder = InternalClientHolder(session_id=where.session_id, base_url=url)
    holder = session.holder
    info = holder.run_coroutine_threadsafe(fetch_training_info(holder, where.model_id)).result(
        CONNECT_TIMEOUT_S
    )
    training = tinker.TrainingClient(
        holder, model_seq_id=where.model_seq_id, model_id=where.model_id, info=info
    )
    training._request_id_counter = training._turn_counter = where.next_request_id
    return training, session
