"""What a cycle's operations cost: wall time and billed usage per operation kind."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from whitney import wire


class OperationLog:
    """Accumulates wall seconds and `usage` counters per operation kind for one cycle."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    @contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        """Add the wall time of the block to `kind` (a fan-out counts once, as a phase)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[kind] += time.perf_counter() - started

    def record(self, operation: wire.Operation) -> None:
        """Add the operation's usage counters to its kind."""
        for name, value in operation.usage.items():
            self.usage[operation.kind][name] += int(value)

    def tokens(self, kind: str, counter: str = "tokens") -> int:
        """Billed `counter` of `kind` so far (falling back to plain `tokens`)."""
        usage = self.usage.get(kind, {})
        return int(usage.get(counter, usage.get("tokens", 0)))
