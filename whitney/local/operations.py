"""`Operations`: an operation POST journaled (or answered from its stored twin), and the
journal read back, one operation (a long-poll) or a page."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from whitney import wire
from whitney.errors import InternalError, InvalidRequest, NotFound, RunNotActive
from whitney.local import providers
from whitney.local.admission import Admission
from whitney.local.api_errors import from_validation_error
from whitney.local.config import MAX_WAIT_S, ServerConfig
from whitney.local.execution import Ticket
from whitney.local.fairness import wait_event
from whitney.local.journal import Journal, canonical_json, render_operation
from whitney.local.names import valid_name
from whitney.local.runs import Runs
from whitney.local.workers import Workers, rebuilding

MAX_LIST_LIMIT = 1000
DEFAULT_LIST_LIMIT = 100
OP_TERMINAL = wire.OPERATION_TERMINAL


@dataclass(frozen=True)
class RawJson:
    """An answer already serialised (operations: the journal's JSON texts spliced together)."""

    text: str


@dataclass(frozen=True)
class Waiting:
    """An operation answer to give once `ticket` is done or `timeout_s` has passed: the HTTP
    layer awaits `Operations.wait(...)`, then `render_waited(...)`."""

    run_id: str
    seq_id: int
    ticket: Ticket
    timeout_s: float


@dataclass(eq=False, repr=False)
class Operations:
    """The operations of every run: submitted, awaited, read."""

    config: ServerConfig
    journal: Journal
    workers: Workers
    runs: Runs
    admission: Admission

    def submit(
        self, tenant: str, run_id: str, sampler_id: str | None, body: Any
    ) -> RawJson | Waiting:
        """Journal an operation (or find its stored twin) and answer once it is terminal or
        after `post_wait_s` (a `Waiting` while it is not)."""
        run = self.runs.own(tenant, run_id, live=True)
        if not isinstance(body, dict):
            raise InvalidRequest("body: expected a JSON object", details={"field": "body"})
        try:
            request = wire.OperationRequest.model_validate(body)
        except ValidationError as exc:
            raise from_validation_error(exc) from None
        if sampler_id is not None and not valid_name(sampler_id):
            raise InvalidRequest(
                f"sampler_id: invalid sampler id {sampler_id!r}", details={"field": "sampler_id"}
            )
        kind, seq_id = request.kind, request.seq_id
        providers.check_route(kind, sampler_id is not None, run_id)
        try:
            model = wire.validate_payload(kind, request.payload)
        except ValidationError as exc:
            raise from_validation_error(exc, "payload") from None
        payload = model.model_dump(mode="json")
        payload_json = canonical_json(payload)
        payload_hash = hashlib.sha256(payload_json.encode()).hexdigest()

        worker, is_rebuilding = self.workers.get_or_rebuilding(run_id)
        if worker is None:
            # not active: only a resend of a journaled operation gets an answer, and while the
            # run is rebuilt only that of a terminal one
            header = self.journal.get_operation_header(run_id, seq_id)
            if is_rebuilding and (header is None or header["status"] not in OP_TERMINAL):
                raise rebuilding(run_id)
            self.admission.existing(run_id, seq_id, kind, sampler_id, payload_hash)
            return self._render(run_id, seq_id)
        with worker.cond:
            header = self.admission.existing(run_id, seq_id, kind, sampler_id, payload_hash)
            if header is not None:
                ticket = worker.tickets.get(seq_id)
            else:
                if worker.status != "ready":
                    raise RunNotActive(
                        f"run {run_id} is {worker.status}: it accepts no new operation",
                        details={"run_id": run_id, "status": worker.status},
                    )
                self.admission.check_new(tenant, run, worker, seq_id, kind, sampler_id, payload)
                submitted_at = self.journal.insert_operation(
                    run_id, seq_id, kind, sampler_id, payload_hash, payload_json
                )
                ticket = Ticket(
                    seq_id=seq_id,
                    kind=kind,
                    sampler_id=sampler_id,
                    payload=payload,
                    submitted_at=submitted_at,
                )
                worker.add(ticket)
        return self._answer(run_id, seq_id, ticket, self.config.post_wait_s)

    def _answer(
        self, run_id: str, seq_id: int, ticket: Ticket | None, wait_s: float
    ) -> RawJson | Waiting:
        """The operation now, or a `Waiting` while its `ticket` is not done within `wait_s`."""
        closing = self.workers.closing.is_set()
        if ticket is None or wait_s <= 0 or ticket.done.is_set() or closing:
            return self._render(run_id, seq_id)
        return Waiting(run_id, seq_id, ticket, wait_s)

    async def wait(self, waiting: Waiting) -> None:
        """On the event loop, holding no thread: until the operation is terminal, the server
        stops (`Workers.wake_waiters`) or `waiting.timeout_s` has passed."""
        if not self.workers.closing.is_set():
            await wait_event(waiting.ticket.done, waiting.timeout_s)

    def render_waited(self, waiting: Waiting) -> RawJson:
        """The operation, after `wait(waiting)`."""
        return self._render(waiting.run_id, waiting.seq_id)

    def _render(self, run_id: str, seq_id: int) -> RawJson:
        row = self.journal.get_operation(run_id, seq_id)
        if row is None:  # pragma: no cover - journaled before we look
            raise InternalError("operation vanished from the journal")
        return RawJson(render_operation(row))

    def get(self, tenant: str, run_id: str, seq_id: int, wait_s: float) -> RawJson | Waiting:
        self.runs.own(tenant, run_id, live=True)
        row = self.journal.get_operation(run_id, seq_id)
        if row is None:
            raise NotFound(
                f"operation {seq_id} of run {run_id} not found",
                details={"run_id": run_id, "seq_id": seq_id},
            )
        if row["status"] not in OP_TERMINAL and wait_s > 0:
            worker, is_rebuilding = self.workers.get_or_rebuilding(run_id)
            if is_rebuilding:
                raise rebuilding(run_id)
            ticket = worker.ticket(seq_id) if worker is not None else None
            return self._answer(run_id, seq_id, ticket, min(wait_s, MAX_WAIT_S))
        return RawJson(render_operation(row))

    def page(self, tenant: str, run_id: str, after_seq: int, limit: int | None) -> RawJson:
        """The run's operations after `after_seq`, at most `limit` of them."""
        self.runs.own(tenant, run_id)
        limit = DEFAULT_LIST_LIMIT if limit is None else limit
        if limit < 1 or limit > MAX_LIST_LIMIT:
            raise InvalidRequest(
                f"limit: must be within 1..{MAX_LIST_LIMIT}, got {limit}",
                details={"field": "limit"},
            )
        rows = self.journal.list_operations(run_id, after_seq, limit)
        return RawJson('{"operations":[' + ",".join(render_operation(r) for r in rows) + "]}")
