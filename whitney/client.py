"""`WhitneyClient`: a synchronous, thread-safe client for the Whitney training API.

The client speaks the API: each method validates its request with `whitney.wire` (refusing,
before anything is sent, what the contract refuses: `whitney.preflight`), sends it through its
`whitney.transport.Transport` (retries, backoff, the API key; the boundary where HTTP answers
become the typed errors of `whitney.errors`), and parses the answer. Seq ids come from a
`whitney.seq_ids.SeqLedger`.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from whitney import clock, wire
from whitney.errors import InvalidRequest, OperationFailed, OperationTimeout, WhitneyError
from whitney.leases import LeaseKeeper
from whitney.preflight import check_operation, format_loc, validated
from whitney.seq_ids import SeqLedger
from whitney.transport import RetryPolicy, Transport

__all__ = ["WhitneyClient"]

API_URL_ENV = "WHITNEY_API_URL"
API_KEY_ENV = "WHITNEY_API_KEY"
MAX_SERVER_WAIT_S = 60.0
"""The server holds a long-poll GET at most this long (docs/api.md)."""

_ModelT = TypeVar("_ModelT", bound=BaseModel)


def _segment(value: str) -> str:
    """One URL path segment: an id can never add a segment or a query."""
    return quote(str(value), safe="")


def _given_or_env(value: str | None, argument: str, env: str, what: str) -> str:
    """`value` if given, else the environment variable `env` (set and not empty); ValueError if
    neither."""
    if value is None:
        value = os.environ.get(env) or None
        if value is None:
            raise ValueError(
                f"no Whitney {what}: pass {argument}= or set the {env} environment variable"
            )
    return value


def _operation_failed(operation: wire.Operation, transport: Transport) -> OperationFailed:
    """The operation's own error (type, message, details) as an OperationFailed, the API key
    masked."""
    error = operation.error if isinstance(operation.error, dict) else {}
    error_type = error.get("type") if isinstance(error.get("type"), str) else None
    message = error.get("message") if isinstance(error.get("message"), str) else None
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    if not message:
        message = (
            f"{operation.kind}[seq={operation.seq_id}] on run {operation.run_id} "
            f"ended {operation.status}"
        )
    if error_type is None:
        error_type = f"operation_{operation.status}"
    failure = OperationFailed(
        transport.scrub(message),
        type=error_type,
        details=transport.scrub_value(details),
    )
    failure.operation = operation
    failure.run_id = operation.run_id
    failure.seq_id = operation.seq_id
    failure.kind = operation.kind
    failure.operation_status = operation.status
    return failure


class WhitneyClient:
    """A client for one Whitney endpoint and API key. Use it as a context manager, or `close()` it.

    `base_url` and `api_key` default to the WHITNEY_API_URL and WHITNEY_API_KEY environment
    variables. `timeout` bounds each HTTP request (a long-poll GET gets its wait on top);
    `max_attempts` and `max_retry_seconds` bound the retries of one call; `backoff_base` and
    `backoff_max` shape the full-jitter exponential backoff; `poll_wait_s` is how long each
    long-poll GET of an operation asks the server to wait; `transport` replaces httpx's.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_attempts: int = 6,
        max_retry_seconds: float = 120.0,
        backoff_base: float = 0.2,
        backoff_max: float = 10.0,
        poll_wait_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base_url = _given_or_env(base_url, "base_url", API_URL_ENV, "base URL")
        api_key = _given_or_env(api_key, "api_key", API_KEY_ENV, "API key")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        if not api_key:
            raise ValueError("api_key must not be empty")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        for name, value in (
            ("timeout", timeout),
            ("max_retry_seconds", max_retry_seconds),
            ("backoff_base", backoff_base),
            ("backoff_max", backoff_max),
            ("poll_wait_s", poll_wait_s),
        ):
            if not value >= 0:
                raise ValueError(f"{name} must be a non-negative number")

        self.base_url: str = base_url.rstrip("/")
        self._poll_wait_s = min(float(poll_wait_s), MAX_SERVER_WAIT_S)
        self._transport = Transport(
            self.base_url,
            api_key,
            timeout=float(timeout),
            retry=RetryPolicy(
                max_attempts=int(max_attempts),
                max_retry_seconds=float(max_retry_seconds),
                backoff_base=float(backoff_base),
                backoff_max=float(backoff_max),
            ),
            transport=transport,
        )
        self._seq_ids = SeqLedger(load=self._next_seq_id)
        self._leases: LeaseKeeper | None = None
        self._leases_asked = False
        self._leases_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"WhitneyClient(base_url={self.base_url!r})"

    def __enter__(self) -> WhitneyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop renewing leases and close the connection pool. Idempotent."""
        if self._leases is not None:
            self._leases.stop()
        self._transport.close()

    # -- capabilities and sessions -----------------------------------------------------------

    def capabilities(self) -> wire.Capabilities:
        return self._get_model(wire.Capabilities, "/v1/training/capabilities")

    def open_session(
        self, labels: dict[str, str] | None = None, idempotency_key: str | None = None
    ) -> wire.Session:
        """Open a session. Without `idempotency_key`, one is made for this call, so a retried
        POST can never open two sessions."""
        body = validated(wire.SessionCreate, {"labels": dict(labels or {})}, "session")
        response = self._transport.send(
            "POST", "/v1/sessions", body=body, headers=self._idempotency(idempotency_key)
        )
        session = self._parse(wire.Session, response)
        leases = self._lease_keeper()
        if leases is not None:
            leases.hold(session.session_id)
        return session

    def heartbeat_session(self, session_id: str) -> wire.Session:
        """Renew an open session's lease (a client that opened it does so by itself)."""
        response = self._transport.send("POST", f"/v1/sessions/{_segment(session_id)}/heartbeat")
        return self._parse(wire.Session, response)

    def _lease_keeper(self) -> LeaseKeeper | None:
        """The lease keeper, made on the first session when the server states a lease
        (`session_ttl_s` in its capabilities); None when its sessions never expire."""
        with self._leases_lock:
            if not self._leases_asked:
                ttl = self.capabilities().session_ttl_s
                if ttl:
                    self._leases = LeaseKeeper(self.heartbeat_session, ttl / 3)
                self._leases_asked = True
            return self._leases

    def get_session(self, session_id: str) -> wire.Session:
        return self._get_model(wire.Session, f"/v1/sessions/{_segment(session_id)}")

    def list_sessions(self, label: str | None = None) -> list[wire.Session]:
        """The caller's sessions; with `label` ("KEY:VALUE"), only those bearing that label."""
        params = None
        if label is not None:
            if ":" not in label:
                raise InvalidRequest(f"label must be 'KEY:VALUE', got {label!r}")
            params = {"label": label}
        response = self._transport.send("GET", "/v1/sessions", params=params)
        return self._parse(wire.SessionList, response).sessions

    def close_session(self, session_id: str) -> wire.Session:
        """Close a session; the server cancels its non-terminal runs first. Idempotent."""
        if self._leases is not None:
            self._leases.release(session_id)
        response = self._transport.send("POST", f"/v1/sessions/{_segment(session_id)}/close")
        return self._parse(wire.Session, response)

    # -- runs --------------------------------------------------------------------------------

    def create_run(
        self,
        session_id: str,
        provider: str,
        base_model: str,
        *,
        lora_rank: int = 8,
        seed: int | None = None,
        role: str = "policy",
        trainable: bool = True,
        from_checkpoint: str | None = None,
        labels: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> wire.Run:
        """Create a run. Without `idempotency_key`, one is made for this call, so a retried
        POST can never create two runs."""
        body = validated(
            wire.RunCreate,
            {
                "session_id": session_id,
                "provider": provider,
                "base_model": base_model,
                "lora_rank": lora_rank,
                "seed": seed,
                "role": role,
                "trainable": trainable,
                "from_checkpoint": from_checkpoint,
                "labels": dict(labels or {}),
            },
            "run",
        )
        response = self._transport.send(
            "POST", "/v1/training/runs", body=body, headers=self._idempotency(idempotency_key)
        )
        return self._parse(wire.Run, response)

    def get_run(self, run_id: str) -> wire.Run:
        return self._get_model(wire.Run, f"/v1/training/runs/{_segment(run_id)}")

    def finish(self, run_id: str) -> wire.Run:
        """Drain the run's queued operations, then `finished`. Idempotent."""
        response = self._transport.send("POST", f"/v1/training/runs/{_segment(run_id)}/finish")
        return self._parse(wire.Run, response)

    def cancel(self, run_id: str) -> wire.Run:
        """Cancel the run; its pending operations become `cancelled`. Idempotent."""
        response = self._transport.send("POST", f"/v1/training/runs/{_segment(run_id)}/cancel")
        return self._parse(wire.Run, response)

    def wait_terminal(self, run_id: str, timeout: float = 60.0) -> wire.Run:
        """Poll the run until it is finished, cancelled or failed; OperationTimeout after
        `timeout` seconds."""
        deadline = clock.monotonic() + timeout
        interval = 0.2
        while True:
            run = self.get_run(run_id)
            if run.status in wire.RUN_TERMINAL:
                return run
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                raise OperationTimeout(
                    f"run {run_id} is still {run.status!r} after {timeout:g}s",
                    details={"run_id": run_id, "status": run.status},
                )
            clock.sleep(min(interval, remaining))
            interval = min(interval * 2, 2.0)

    # -- operations --------------------------------------------------------------------------

    def execute(
        self,
        run_id: str,
        kind: str,
        payload: dict,
        *,
        seq_id: int | None = None,
        sampler_id: str | None = None,
        timeout: float | None = None,
    ) -> wire.Operation:
        """Submit one operation and wait until it is terminal; return it (with `usage`).

        On the sampler route when `sampler_id` is given. Without `seq_id`, the run's next id
        from the client's `SeqLedger`. Raises OperationFailed if the operation ended failed or
        cancelled, OperationTimeout if it is not terminal after `timeout` seconds (None: no
        bound; the same call with the same seq_id picks it up again).
        """
        check_operation(kind, payload, sampler_id)
        if seq_id is not None and (type(seq_id) is not int or seq_id < 1):
            raise InvalidRequest(f"seq_id must be a positive integer, got {seq_id!r}")
        deadline = None if timeout is None else clock.monotonic() + timeout
        auto = seq_id is None
        if seq_id is None:
            seq_id = self.reserve_seq_ids(run_id, 1).start
        else:
            self._seq_ids.observe(run_id, seq_id)
        body = {"seq_id": seq_id, "kind": kind, "payload": payload}
        path = f"/v1/training/runs/{_segment(run_id)}/operations"
        if sampler_id is not None:
            path = (
                f"/v1/training/runs/{_segment(run_id)}/samplers/{_segment(sampler_id)}/operations"
            )
        try:
            response = self._transport.send("POST", path, body=body)
        except WhitneyError:
            if auto:
                # The server may or may not hold this id: take the next one from its journal.
                self._seq_ids.forget(run_id)
            raise
        operation = self._parse(wire.Operation, response)
        operation = self._await_terminal(run_id, operation, deadline)
        if operation.status != "succeeded":
            raise _operation_failed(operation, self._transport)
        return operation

    def run_operation(
        self, run_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        """A run operation's result: `execute(run_id, kind, payload, seq_id=seq_id).result`."""
        return self.execute(run_id, kind, payload, seq_id=seq_id).result or {}

    def sampler_operation(
        self,
        run_id: str,
        sampler_id: str,
        kind: str,
        payload: dict,
        *,
        seq_id: int | None = None,
    ) -> dict:
        """A sampler operation's result; it takes its seq_id from the run's sequence."""
        operation = self.execute(run_id, kind, payload, seq_id=seq_id, sampler_id=sampler_id)
        return operation.result or {}

    def get_operation(self, run_id: str, seq_id: int, wait_s: float = 0.0) -> wire.Operation:
        """One operation of the run; with `wait_s`, the server holds the answer up to that
        long (at most 60 s) for a terminal status."""
        wait_s = max(0.0, min(float(wait_s), MAX_SERVER_WAIT_S))
        params = {"wait_s": f"{wait_s:g}"} if wait_s > 0 else None
        response = self._transport.send(
            "GET",
            f"/v1/training/runs/{_segment(run_id)}/operations/{int(seq_id)}",
            params=params,
            timeout=self._transport.timeout + wait_s,
        )
        return self._parse(wire.Operation, response)

    def journal(self, run_id: str, after_seq: int = 0, limit: int = 100) -> list[wire.Operation]:
        """The run's operations with seq_id > `after_seq`, at most `limit` of them."""
        response = self._transport.send(
            "GET",
            f"/v1/training/runs/{_segment(run_id)}/operations",
            params={"after_seq": int(after_seq), "limit": int(limit)},
        )
        return self._parse(wire.OperationList, response).operations

    def iter_journal(self, run_id: str, page_size: int = 100) -> Iterator[wire.Operation]:
        """Every operation of the run's journal in seq order, `page_size` per request, fetched
        as the caller goes (stop early and no further page is read)."""
        after = 0
        while True:
            page = self.journal(run_id, after_seq=after, limit=page_size)
            yield from page
            if len(page) < page_size:
                return
            after = page[-1].seq_id

    def download_artifact(self, artifact_id: str, path: str | os.PathLike) -> Path:
        """Stream an artifact's bytes to `path` (into `path/<artifact_id>` if `path` is a
        directory), atomically: the file appears complete or not at all."""
        target = Path(path)
        if target.is_dir():
            name = _segment(artifact_id)
            if name in ("", ".", ".."):
                raise ValueError(f"artifact_id {artifact_id!r} cannot name a file")
            target = target / name
        target.parent.mkdir(parents=True, exist_ok=True)
        self._transport.send("GET", f"/v1/artifacts/{_segment(artifact_id)}", sink=target)
        return target

    # -- seq ids -----------------------------------------------------------------------------

    def reserve_seq_ids(self, run_id: str, n: int) -> range:
        """Take the next `n` seq ids of the run from this client's ledger, loading it from
        the server's `next_seq_id` on first use."""
        if type(n) is not int or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        return self._seq_ids.reserve(run_id, n)

    def sync_seq(self, run_id: str) -> int:
        """Reload the run's position from the server's `next_seq_id`; return it."""
        return self._seq_ids.reload(run_id)

    def _next_seq_id(self, run_id: str) -> int:
        return self.get_run(run_id).next_seq_id

    # -- operations' answers -----------------------------------------------------------------

    def _await_terminal(
        self, run_id: str, operation: wire.Operation, deadline: float | None
    ) -> wire.Operation:
        """Long-poll the operation until it is terminal (or `deadline` passes)."""
        idle = 0.05
        while operation.status not in wire.OPERATION_TERMINAL:
            wait = self._poll_wait_s
            if deadline is not None:
                remaining = deadline - clock.monotonic()
                if remaining <= 0:
                    raise OperationTimeout(
                        f"{operation.kind}[seq={operation.seq_id}] on run {run_id} is still "
                        f"{operation.status!r} after the caller's timeout",
                        details={
                            "run_id": run_id,
                            "seq_id": operation.seq_id,
                            "kind": operation.kind,
                            "status": operation.status,
                        },
                    )
                wait = min(wait, remaining)
            asked = clock.monotonic()
            operation = self.get_operation(run_id, operation.seq_id, wait_s=wait)
            if (
                operation.status not in wire.OPERATION_TERMINAL
                and clock.monotonic() - asked < wait / 2
            ):
                # The server answered early and not terminal: do not spin on it.
                clock.sleep(idle)
                idle = min(idle * 2, 1.0)
        return operation

    # -- answers -----------------------------------------------------------------------------

    @staticmethod
    def _idempotency(key: str | None) -> dict[str, str]:
        return {"Idempotency-Key": key if key is not None else uuid.uuid4().hex}

    def _get_model(self, model: type[_ModelT], path: str) -> _ModelT:
        return self._parse(model, self._transport.send("GET", path))

    def _parse(self, model: type[_ModelT], response: httpx.Response) -> _ModelT:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as error:
            problems = "; ".join(
                f"{format_loc(item['loc'])}: {item['msg']}"
                for item in error.errors(include_url=False, include_input=False)[:5]
            )
            failure = WhitneyError(
                f"unexpected answer to {response.request.method} {response.request.url.path} "
                f"(HTTP {response.status_code}): not a {model.__name__}: {problems}",
                status=response.status_code,
                type="invalid_response",
            )
        raise failure
