"""`WhitneyClient`: a synchronous, thread-safe client for the Whitney training API.

One pooled `httpx.Client` per instance. Every request is validated with `whitney.wire` before it
is sent; transport errors, timeouts, 429 and 5xx answers are retried with the same body (so the
same `seq_id`: the server never runs an operation twice), with exponential backoff and full
jitter, bounded by attempts and by total time; an answer with a positive Retry-After (the server
says when to come back: a rate limit, a run being rebuilt after a restart) is retried then, up
to the total time whatever the attempts; other 4xx answers are raised at once as the typed
errors of `whitney.errors`.

The API key is sent in the Authorization header and nowhere else: it never appears in
`repr(client)`, in a log line, or in the text, args or cause chain of an exception raised here.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import os
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from whitney import wire
from whitney.errors import (
    InvalidRequest,
    OperationFailed,
    OperationTimeout,
    TransportError,
    WhitneyError,
    error_for,
)
from whitney.leases import LeaseKeeper
from whitney.seq_ids import SeqLedger

__all__ = ["WhitneyClient"]

logger = logging.getLogger("whitney.client")

API_URL_ENV = "WHITNEY_API_URL"
API_KEY_ENV = "WHITNEY_API_KEY"
MAX_SERVER_WAIT_S = 60.0
"""The server holds a long-poll GET at most this long (docs/api.md)."""

_ModelT = TypeVar("_ModelT", bound=BaseModel)


def _sleep(seconds: float) -> None:
    """Every wait of the client goes through here (tests replace it)."""
    time.sleep(seconds)


def _clock() -> float:
    """The client's monotonic clock (tests replace it together with `_sleep`)."""
    return time.monotonic()


class _Secret:
    """Holds the API key; its repr and str never show it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a Whitney API key is not picklable")


class _BearerAuth(httpx.Auth):
    """Sets the Authorization header on each request as it is sent, so the key lives in one
    `_Secret` and not in the pooled client's default headers."""

    def __init__(self, key: _Secret) -> None:
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Any:
        request.headers["Authorization"] = f"Bearer {self._key.reveal()}"
        yield request

    def __repr__(self) -> str:
        return "_BearerAuth(<secret>)"


def _segment(value: str) -> str:
    """One URL path segment: an id can never add a segment or a query."""
    return quote(str(value), safe="")


def _format_loc(loc: tuple[int | str, ...], prefix: str = "") -> str:
    text = prefix
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(root)"


def _invalid_request(
    error: ValidationError, what: str, prefix: str = "", limit: int = 5
) -> InvalidRequest:
    """An InvalidRequest (status None: nothing was sent) naming every refused field."""
    problems = [
        {"loc": _format_loc(item["loc"], prefix), "msg": item["msg"], "type": item["type"]}
        for item in error.errors(include_url=False, include_input=False, include_context=False)
    ]
    shown = "; ".join(f"{problem['loc']}: {problem['msg']}" for problem in problems[:limit])
    if len(problems) > limit:
        shown += f"; and {len(problems) - limit} more"
    return InvalidRequest(f"invalid {what}: {shown}", details={"errors": problems})


def _parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None if unusable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


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
        self._key = _Secret(api_key)
        self._timeout = float(timeout)
        self._max_attempts = int(max_attempts)
        self._max_retry_seconds = float(max_retry_seconds)
        self._backoff_base = float(backoff_base)
        self._backoff_max = float(backoff_max)
        self._poll_wait_s = min(float(poll_wait_s), MAX_SERVER_WAIT_S)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Accept": "application/json"},
            auth=_BearerAuth(self._key),
            timeout=self._timeout,
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
        self._http.close()

    # -- capabilities and sessions -----------------------------------------------------------

    def capabilities(self) -> wire.Capabilities:
        return self._get_model(wire.Capabilities, "/v1/training/capabilities")

    def open_session(
        self, labels: dict[str, str] | None = None, idempotency_key: str | None = None
    ) -> wire.Session:
        """Open a session. Without `idempotency_key`, one is made for this call, so a retried
        POST can never open two sessions."""
        body = self._validated(wire.SessionCreate, {"labels": dict(labels or {})}, "session")
        response = self._send(
            "POST", "/v1/sessions", body=body, headers=self._idempotency(idempotency_key)
        )
        session = self._parse(wire.Session, response)
        leases = self._lease_keeper()
        if leases is not None:
            leases.hold(session.session_id)
        return session

    def heartbeat_session(self, session_id: str) -> wire.Session:
        """Renew an open session's lease (a client that opened it does so by itself)."""
        response = self._send("POST", f"/v1/sessions/{_segment(session_id)}/heartbeat")
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
        response = self._send("GET", "/v1/sessions", params=params)
        return self._parse(wire.SessionList, response).sessions

    def close_session(self, session_id: str) -> wire.Session:
        """Close a session; the server cancels its non-terminal runs first. Idempotent."""
        if self._leases is not None:
            self._leases.release(session_id)
        response = self._send("POST", f"/v1/sessions/{_segment(session_id)}/close")
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
        body = self._validated(
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
        response = self._send(
            "POST", "/v1/training/runs", body=body, headers=self._idempotency(idempotency_key)
        )
        return self._parse(wire.Run, response)

    def get_run(self, run_id: str) -> wire.Run:
        return self._get_model(wire.Run, f"/v1/training/runs/{_segment(run_id)}")

    def finish(self, run_id: str) -> wire.Run:
        """Drain the run's queued operations, then `finished`. Idempotent."""
        response = self._send("POST", f"/v1/training/runs/{_segment(run_id)}/finish")
        return self._parse(wire.Run, response)

    def cancel(self, run_id: str) -> wire.Run:
        """Cancel the run; its pending operations become `cancelled`. Idempotent."""
        response = self._send("POST", f"/v1/training/runs/{_segment(run_id)}/cancel")
        return self._parse(wire.Run, response)

    def wait_terminal(self, run_id: str, timeout: float = 60.0) -> wire.Run:
        """Poll the run until it is finished, cancelled or failed; OperationTimeout after
        `timeout` seconds."""
        deadline = _clock() + timeout
        interval = 0.2
        while True:
            run = self.get_run(run_id)
            if run.status in wire.RUN_TERMINAL:
                return run
            remaining = deadline - _clock()
            if remaining <= 0:
                raise OperationTimeout(
                    f"run {run_id} is still {run.status!r} after {timeout:g}s",
                    details={"run_id": run_id, "status": run.status},
                )
            _sleep(min(interval, remaining))
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
        self._check_operation(kind, payload, sampler_id)
        if seq_id is not None and (type(seq_id) is not int or seq_id < 1):
            raise InvalidRequest(f"seq_id must be a positive integer, got {seq_id!r}")
        deadline = None if timeout is None else _clock() + timeout
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
            response = self._send("POST", path, body=body)
        except WhitneyError:
            if auto:
                # The server may or may not hold this id: take the next one from its journal.
                self._seq_ids.forget(run_id)
            raise
        operation = self._parse(wire.Operation, response)
        operation = self._await_terminal(run_id, operation, deadline)
        if operation.status != "succeeded":
            raise self._operation_failed(operation)
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
        response = self._send(
            "GET",
            f"/v1/training/runs/{_segment(run_id)}/operations/{int(seq_id)}",
            params=params,
            timeout=self._timeout + wait_s,
        )
        return self._parse(wire.Operation, response)

    def journal(self, run_id: str, after_seq: int = 0, limit: int = 100) -> list[wire.Operation]:
        """The run's operations with seq_id > `after_seq`, at most `limit` of them."""
        response = self._send(
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
        self._send("GET", f"/v1/artifacts/{_segment(artifact_id)}", sink=target)
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

    # -- operation helpers -------------------------------------------------------------------

    def _check_operation(self, kind: str, payload: Any, sampler_id: str | None) -> None:
        """Refuse, before anything is sent, an operation the wire contract refuses."""
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
            problem = _invalid_request(error, f"{kind} payload", prefix="payload")
        else:
            return
        raise problem

    def _await_terminal(
        self, run_id: str, operation: wire.Operation, deadline: float | None
    ) -> wire.Operation:
        """Long-poll the operation until it is terminal (or `deadline` passes)."""
        idle = 0.05
        while operation.status not in wire.OPERATION_TERMINAL:
            wait = self._poll_wait_s
            if deadline is not None:
                remaining = deadline - _clock()
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
            asked = _clock()
            operation = self.get_operation(run_id, operation.seq_id, wait_s=wait)
            if operation.status not in wire.OPERATION_TERMINAL and _clock() - asked < wait / 2:
                # The server answered early and not terminal: do not spin on it.
                _sleep(idle)
                idle = min(idle * 2, 1.0)
        return operation

    def _operation_failed(self, operation: wire.Operation) -> OperationFailed:
        """The operation's own error (type, message, details) as an OperationFailed."""
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
            self._scrub(message), type=error_type, details=self._scrub_value(details)
        )
        failure.operation = operation
        failure.run_id = operation.run_id
        failure.seq_id = operation.seq_id
        failure.kind = operation.kind
        failure.operation_status = operation.status
        return failure

    # -- HTTP --------------------------------------------------------------------------------

    @staticmethod
    def _idempotency(key: str | None) -> dict[str, str]:
        return {"Idempotency-Key": key if key is not None else uuid.uuid4().hex}

    @staticmethod
    def _validated(model: type[BaseModel], body: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            model.model_validate(body)
        except ValidationError as error:
            problem = _invalid_request(error, what)
        else:
            return body
        raise problem

    def _get_model(self, model: type[_ModelT], path: str) -> _ModelT:
        return self._parse(model, self._send("GET", path))

    def _parse(self, model: type[_ModelT], response: httpx.Response) -> _ModelT:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as error:
            problems = "; ".join(
                f"{_format_loc(item['loc'])}: {item['msg']}"
                for item in error.errors(include_url=False, include_input=False)[:5]
            )
            failure = WhitneyError(
                f"unexpected answer to {response.request.method} {response.request.url.path} "
                f"(HTTP {response.status_code}): not a {model.__name__}: {problems}",
                status=response.status_code,
                type="invalid_response",
            )
        raise failure

    def _backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(backoff_max, backoff_base * 2**(attempt-1))]."""
        ceiling = min(self._backoff_max, self._backoff_base * 2 ** (attempt - 1))
        return random.uniform(0.0, ceiling)

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        sink: Path | None = None,
    ) -> httpx.Response:
        """Send one request, retrying what may be retried with the very same bytes.

        Returns the 2xx response; raises the typed WhitneyError of the last failure.
        """
        request_headers = dict(headers or {})
        content: bytes | None = None
        if body is not None:
            try:
                content = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
            except (TypeError, ValueError) as error:
                problem = InvalidRequest(f"request body is not JSON: {error}")
            else:
                problem = None
            if problem is not None:
                raise problem
            request_headers["Content-Type"] = "application/json"
        started = _clock()
        deadline = started + self._max_retry_seconds
        attempt = 0
        while True:
            attempt += 1
            response, failure, retryable, reason = self._attempt(
                method, path, params, content, request_headers, timeout, sink
            )
            if response is not None:
                return response
            assert failure is not None
            asked_to_wait = failure.retry_after is not None and failure.retry_after > 0
            if not retryable or (attempt >= self._max_attempts and not asked_to_wait):
                break
            delay = failure.retry_after
            if delay is None:
                delay = self._backoff(attempt)
            if _clock() + delay > deadline:
                break
            logger.warning(
                "Whitney %s %s failed (%s) on attempt %d%s; retrying in %.2fs",
                method,
                path,
                reason,
                attempt,
                " (the server asked to wait)" if asked_to_wait else f" of {self._max_attempts}",
                delay,
            )
            _sleep(delay)
        if attempt > 1:
            elapsed = _clock() - started
            logger.warning(
                "Whitney %s %s failed (%s) after %d attempts in %.1f s; giving up",
                method,
                path,
                reason,
                attempt,
                elapsed,
            )
            failure.message += f" (gave up after {attempt} attempts in {elapsed:.1f} s)"
        raise failure

    def _attempt(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        content: bytes | None,
        headers: dict[str, str],
        timeout: float | None,
        sink: Path | None,
    ) -> tuple[httpx.Response | None, WhitneyError | None, bool, str]:
        """One try: (response, None, _, _) on 2xx, else (None, error, retryable, reason).

        The error is built here but raised by the caller outside any `except` block, so the
        httpx exception (which carries the request and its Authorization header) is neither
        its cause nor its context.
        """
        kwargs: dict[str, Any] = {"params": params, "headers": headers, "content": content}
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            if sink is None:
                response = self._http.request(method, path, **kwargs)
            else:
                with self._http.stream(method, path, **kwargs) as response:
                    if response.is_success:
                        self._write_atomically(response, sink)
                    else:
                        response.read()
        except httpx.RequestError as error:
            retryable = isinstance(error, httpx.TransportError) and not isinstance(
                error, httpx.UnsupportedProtocol
            )
            name = type(error).__name__
            detail = self._scrub(str(error))
            failure = TransportError(
                f"{method} {path}: {name}" + (f": {detail}" if detail else ""),
                details={"method": method, "path": path, "exception": name},
            )
            return None, failure, retryable, name
        if response.is_success:
            return response, None, False, ""
        status = response.status_code
        return None, self._error_for(response), status == 429 or status >= 500, f"HTTP {status}"

    @staticmethod
    def _write_atomically(response: httpx.Response, target: Path) -> None:
        descriptor, partial = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=".part"
        )
        try:
            with os.fdopen(descriptor, "wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
            os.chmod(partial, 0o644)
            os.replace(partial, target)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise

    def _error_for(self, response: httpx.Response) -> WhitneyError:
        """The typed error of a non-2xx answer; a body that is not the error JSON still gives
        one, typed by the status."""
        status = response.status_code
        retry_after = _parse_retry_after(response.headers.get("Retry-After"))
        error_type: str | None = None
        message: str | None = None
        details: dict[str, Any] = {}
        try:
            body = json.loads(response.content)
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            if isinstance(error.get("type"), str) and error["type"]:
                error_type = error["type"]
            if isinstance(error.get("message"), str) and error["message"]:
                message = error["message"]
            if isinstance(error.get("details"), dict):
                details = error["details"]
        if message is None:
            try:
                text = " ".join(response.text.split())
            except (UnicodeDecodeError, LookupError):
                text = ""
            message = f"HTTP {status} {response.reason_phrase}".rstrip()
            if text:
                message += f": {text[:200]}"
        return error_for(
            status,
            error_type,
            self._scrub(message),
            self._scrub_value(details),
            retry_after,
        )

    def _scrub(self, text: str) -> str:
        """`text` with the API key masked, should a server or a library ever echo it."""
        key = self._key.reveal()
        return text.replace(key, "***") if len(key) >= 4 else text

    def _scrub_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._scrub(value)
        if isinstance(value, dict):
            return {self._scrub(str(k)): self._scrub_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub_value(item) for item in value]
        return value
