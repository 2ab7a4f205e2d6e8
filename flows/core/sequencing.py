"""Deterministic seq ids: a ledger hands out each run's ids in order from a known start.

A cycle starts at the id where the previous one ended, and allocates in a deterministic order
(fan-outs reserve their whole block before submitting), so a replayed cycle makes the same
calls with the same ids: completed operations come back from the server's journal, the rest
run once. Allocate from the cycle's own thread only.
"""

from __future__ import annotations

from collections.abc import Mapping


class SeqLedger:
    """The next seq id of each run the cycle operates on."""

    def __init__(self, starts: Mapping[str, int]) -> None:
        for run_id, start in starts.items():
            if start < 1:
                raise ValueError(f"seq ids start at 1, got {start} for run {run_id}")
        self._next = dict(starts)

    def position(self, run_id: str) -> int:
        """The id the run's next operation will get (where this cycle ends, once it is done)."""
        try:
            return self._next[run_id]
        except KeyError:
            raise KeyError(f"no seq start known for run {run_id}") from None

    def next(self, run_id: str) -> int:
        """Allocate the run's next id."""
        return self.reserve(run_id, 1).start

    def reserve(self, run_id: str, count: int) -> range:
        """Allocate a block of `count` consecutive ids (for a fan-out)."""
        if count < 0:
            raise ValueError(f"cannot reserve {count} seq ids")
        start = self.position(run_id)
        self._next[run_id] = start + count
        return range(start, start + count)
