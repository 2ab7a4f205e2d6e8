"""The SDK's clock: every wait of the client and its transport goes through here, so tests
replace these two functions and no test really sleeps."""

from __future__ import annotations

import time


def monotonic() -> float:
    """Seconds on a monotonic clock."""
    return time.monotonic()


def sleep(seconds: float) -> None:
    """Wait `seconds`."""
    time.sleep(seconds)
