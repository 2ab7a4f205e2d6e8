"""A sweep's spending against its `max_cost`, shared by the trial tasks (threads): a trial's
rung starts only if the cost spent, the rungs running, and its own projection fit.

The projection of a rung is its cycles times the dearest cycle of any rung ended so far;
before the first ends there is none, so the first `max_concurrent` rungs always start. A
rung is settled before its slot is given back (flows.sweep.trials), so the trial that takes
the slot next reserves against its cost.
"""

from __future__ import annotations

import threading


class CostLedger:
    """USD spent and reserved by a sweep's trials; `max_cost` None: no limit."""

    def __init__(self, max_cost: float | None) -> None:
        self.max_cost = max_cost
        self.spent = 0.0
        self.per_cycle = 0.0
        self._reserved: dict[str, float] = {}
        self._lock = threading.Lock()

    def reserve(self, key: str, cycles: int) -> bool:
        """Whether the rung `key` of `cycles` cycles may start (then its projection is held)."""
        with self._lock:
            projected = self.per_cycle * cycles
            committed = self.spent + sum(self._reserved.values())
            if self.max_cost is not None and committed + projected > self.max_cost:
                return False
            self._reserved[key] = projected
            return True

    def settle(self, key: str, cost: float | None, cycles: int) -> None:
        """The rung `key` ended having cost `cost` (None: no price table) over `cycles`."""
        with self._lock:
            self._reserved.pop(key, None)
            if cost is None:
                return
            self.spent += cost
            if cycles > 0:
                self.per_cycle = max(self.per_cycle, cost / cycles)
