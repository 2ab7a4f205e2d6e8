"""A daemon thread that polls something while a `with` block runs: the metrics file the CLI's
progress display follows."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from typing import Self


class PollingThread:
    """While entered, runs `poll_until_stopped` in a daemon thread named `name`, in a copy of
    the entering context (the flow's Prefect settings); exiting stops it, then calls
    `stopped`."""

    def __init__(self, name: str, interval_s: float) -> None:
        self.interval_s = interval_s
        self._name = name
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self.poll_until_stopped,), name=self._name, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self.stopped()

    def ticks(self) -> Iterator[None]:
        """One tick every `interval_s` seconds until the block exits."""
        while not self._stopped.wait(self.interval_s):
            yield

    def join(self) -> None:
        """Wait for the thread to end (after the block exits)."""
        if self._thread is not None:
            self._thread.join()

    def poll_until_stopped(self) -> None:
        """The thread's body: typically a loop over `ticks()`."""
        raise NotImplementedError

    def stopped(self) -> None:
        """Called on exit, after the thread was told to stop (it may still be running)."""
