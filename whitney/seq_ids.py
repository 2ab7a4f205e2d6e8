"""`SeqLedger`: the one allocator of seq ids, for the SDK client and the flows alike.

A run's operations carry consecutive seq ids from 1; the ledger hands out each run's next ones
in order from a start it is given (a cycle: where the previous one ended) or, with `load`, that
it reads on first use (the client: the run's `next_seq_id` on the server). Thread-safe: each
run has its own lock, held while its start is loaded, so concurrent callers get disjoint
blocks and the server is asked once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping


class SeqLedger:
    """The next seq id of each run: from `starts`, else (with `load`) loaded on first use."""

    def __init__(
        self, starts: Mapping[str, int] | None = None, load: Callable[[str], int] | None = None
    ) -> None:
        starts = dict(starts or {})
        for run_id, start in starts.items():
            if start < 1:
                raise ValueError(f"seq ids start at 1, got {start} for run {run_id}")
        self._next = starts
        self._load = load
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def position(self, run_id: str) -> int:
        """The id the run's next operation will get (where this cycle ends, once it is done)."""
        with self._lock(run_id):
            return self._position(run_id)

    def next(self, run_id: str) -> int:
        """Allocate the run's next id."""
        return self.reserve(run_id, 1).start

    def reserve(self, run_id: str, count: int) -> range:
        """Allocate a block of `count` consecutive ids (for a fan-out)."""
        if count < 0:
            raise ValueError(f"cannot reserve {count} seq ids")
        with self._lock(run_id):
            start = self._position(run_id)
            self._next[run_id] = start + count
        return range(start, start + count)

    def move_to(self, run_id: str, position: int) -> None:
        """Go on from `position` (where the cycles a flow ran left the run), never back."""
        with self._lock(run_id):
            current = self._position(run_id)
            if position < current:
                raise ValueError(f"run {run_id}: seq id {position} is behind {current}")
            self._next[run_id] = position

    def observe(self, run_id: str, seq_id: int) -> None:
        """An id used outside the ledger: keep a known position past it."""
        with self._lock(run_id):
            current = self._next.get(run_id)
            if current is not None and seq_id >= current:
                self._next[run_id] = seq_id + 1

    def reload(self, run_id: str) -> int:
        """Load the run's position again (with `load`); return it."""
        with self._lock(run_id):
            self._next.pop(run_id, None)
            return self._position(run_id)

    def forget(self, run_id: str) -> None:
        """Drop the run's position: the next allocation loads it again."""
        with self._lock(run_id):
            self._next.pop(run_id, None)

    def _position(self, run_id: str) -> int:
        """With the run's lock held."""
        position = self._next.get(run_id)
        if position is None:
            if self._load is None:
                raise KeyError(f"no seq start known for run {run_id}")
            position = self._next[run_id] = self._load(run_id)
        return position

    def _lock(self, run_id: str) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(run_id)
            if lock is None:
                lock = self._locks[run_id] = threading.Lock()
            return lock
