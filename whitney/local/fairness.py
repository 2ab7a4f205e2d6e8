"""Fair serving: waits that hold no thread, and each tenant's caps and share of the threads.

A long-poll (and an operation POST's post-submit wait) waits on the event loop: it subscribes
to its ticket's `DoneEvent`, which the run's worker thread sets when the operation is terminal
(and the server when it stops). `TenantGate` admits at most `max_requests_per_tenant`
requests and `max_long_polls_per_tenant` long-polls of one tenant at a time (429
`rate_limited` with Retry-After past them) and runs each tenant's service calls under the
tenant's own thread limiter, so one tenant's load never queues another's calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from whitney.errors import RateLimited
from whitney.local.limits import Limits

RETRY_AFTER_S = 1.0
REQUESTS = "max_requests_per_tenant"
LONG_POLLS = "max_long_polls_per_tenant"

_T = TypeVar("_T")


class DoneEvent(threading.Event):
    """A threading.Event that also calls back, once, whoever `subscribe`d to it."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: set[Callable[[], None]] = set()
        self._callbacks_lock = threading.Lock()

    def set(self) -> None:
        with self._callbacks_lock:
            super().set()
            callbacks, self._callbacks = self._callbacks, set()
        for callback in callbacks:
            callback()

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback` (quick, from any thread) once the event is set: now if it is."""
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.add(callback)
                return
        callback()

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        with self._callbacks_lock:
            self._callbacks.discard(callback)


async def wait_event(event: DoneEvent, timeout_s: float) -> None:
    """Wait on the running event loop, holding no thread, until `event` is set or `timeout_s`
    has passed."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(_resolve, woken)

    event.subscribe(wake)
    try:
        await asyncio.wait((woken,), timeout=timeout_s)
    finally:
        event.unsubscribe(wake)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class TenantGate:
    """Per-tenant admission and thread limiters; used on the app's one event loop only (the
    counts need no lock)."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._in_flight: dict[tuple[str, str], int] = {}
        self._limiters: dict[str, anyio.CapacityLimiter] = {}

    @contextlib.contextmanager
    def admit(self, tenant: str, long_poll: bool = False) -> Iterator[None]:
        """Count one request of `tenant` (against its long-poll cap if `long_poll`, else its
        request cap) while the block runs; RateLimited if the cap is reached."""
        name = LONG_POLLS if long_poll else REQUESTS
        cap: int = getattr(self._limits, name)
        key = (tenant, name)
        count = self._in_flight.get(key, 0)
        if count >= cap:
            what = "long-polls" if long_poll else "requests"
            raise RateLimited(
                f"this API key already has {count} {what} in flight, the server's {name}; "
                f"retry after {RETRY_AFTER_S:g} s",
                details={"limit": name, "max": cap},
                retry_after=RETRY_AFTER_S,
            )
        self._in_flight[key] = count + 1
        try:
            yield
        finally:
            self._release(key)

    def _release(self, key: tuple[str, str]) -> None:
        remaining = self._in_flight[key] - 1
        if remaining:
            self._in_flight[key] = remaining
        else:
            del self._in_flight[key]

    async def run_sync(self, tenant: str, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` in a worker thread, under the tenant's own limiter of
        `max_requests_per_tenant` threads."""
        return await anyio.to_thread.run_sync(
            functools.partial(fn, *args), limiter=self._limiter(tenant)
        )

    def _limiter(self, tenant: str) -> anyio.CapacityLimiter:
        limiter = self._limiters.get(tenant)
        if limiter is None:
            limiter = anyio.CapacityLimiter(self._limits.max_requests_per_tenant)
            self._limiters[tenant] = limiter
        return limiter
