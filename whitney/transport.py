"""`Transport`: HTTP to one Whitney endpoint, apart from the API it carries.

One pooled `httpx.Client`. Transport errors, timeouts, 429 and 5xx answers are retried with the
very same bytes (so the same `seq_id`: the server never runs an operation twice), with
exponential backoff and full jitter, bounded by attempts and by total time (`RetryPolicy`); an
answer with a positive Retry-After (the server says when to come back: a rate limit, a run being
rebuilt after a restart) is retried then, up to the total time whatever the attempts. This is
the one boundary where HTTP becomes the typed errors of `whitney.errors`: other 4xx answers are
raised at once as theirs.

The API key is sent in the Authorization header and nowhere else: it never appears in a repr,
in a log line, or in the text, args or cause chain of an exception raised here.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import os
import random
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from whitney import clock
from whitney.errors import InvalidRequest, TransportError, WhitneyError, error_for

__all__ = ["RetryPolicy", "Transport"]

logger = logging.getLogger("whitney.client")
"""The SDK's retries log under the client's name."""


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


@dataclass(frozen=True)
class RetryPolicy:
    """How one call is retried: at most `max_attempts` tries within `max_retry_seconds`, with
    full-jitter exponential backoff shaped by `backoff_base` and `backoff_max`."""

    max_attempts: int = 6
    max_retry_seconds: float = 120.0
    backoff_base: float = 0.2
    backoff_max: float = 10.0

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(backoff_max, backoff_base * 2**(attempt-1))]."""
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        return random.uniform(0.0, ceiling)


def parse_retry_after(value: str | None) -> float | None:
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


class Transport:
    """Requests to `base_url` with the API key, each retried under `retry`; `timeout` bounds
    each HTTP request; `transport` replaces httpx's."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float,
        retry: RetryPolicy,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.timeout = timeout
        self.retry = retry
        self._key = _Secret(api_key)
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Accept": "application/json"},
            auth=_BearerAuth(self._key),
            timeout=timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"Transport(base_url={str(self._http.base_url)!r})"

    def close(self) -> None:
        """Close the connection pool. Idempotent."""
        self._http.close()

    def send(
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
        """Send one request, retrying what may be retried with the very same bytes; with
        `sink`, stream a 2xx answer's body into that file, atomically.

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
        retry = self.retry
        started = clock.monotonic()
        deadline = started + retry.max_retry_seconds
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
            if not retryable or (attempt >= retry.max_attempts and not asked_to_wait):
                break
            delay = failure.retry_after
            if delay is None:
                delay = retry.backoff(attempt)
            if clock.monotonic() + delay > deadline:
                break
            logger.warning(
                "Whitney %s %s failed (%s) on attempt %d%s; retrying in %.2fs",
                method,
                path,
                reason,
                attempt,
                " (the server asked to wait)" if asked_to_wait else f" of {retry.max_attempts}",
                delay,
            )
            clock.sleep(delay)
        if attempt > 1:
            elapsed = clock.monotonic() - started
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
                        _write_atomically(response, sink)
                    else:
                        response.read()
        except httpx.RequestError as error:
            retryable = isinstance(error, httpx.TransportError) and not isinstance(
                error, httpx.UnsupportedProtocol
            )
            name = type(error).__name__
            detail = self.scrub(str(error))
            failure = TransportError(
                f"{method} {path}: {name}" + (f": {detail}" if detail else ""),
                details={"method": method, "path": path, "exception": name},
            )
            return None, failure, retryable, name
        if response.is_success:
            return response, None, False, ""
        status = response.status_code
        return None, self._error_for(response), status == 429 or status >= 500, f"HTTP {status}"

    def _error_for(self, response: httpx.Response) -> WhitneyError:
        """The typed error of a non-2xx answer; a body that is not the error JSON still gives
        one, typed by the status."""
        status = response.status_code
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
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
            self.scrub(message),
            self.scrub_value(details),
            retry_after,
        )

    def scrub(self, text: str) -> str:
        """`text` with the API key masked, should a server or a library ever echo it."""
        key = self._key.reveal()
        return text.replace(key, "***") if len(key) >= 4 else text

    def scrub_value(self, value: Any) -> Any:
        """`value` (a JSON value) with the API key masked in every string."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrub(str(k)): self.scrub_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub_value(item) for item in value]
        return value


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
