"""Fair serving: waits that hold no thread.

A long-poll (and an operation POST's post-submit wait) waits on the event loop: it subscribes
to its ticket's `DoneEvent`, which the run's worker thread sets when the operation is terminal
(and the server when it stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable


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
