"""Fault injection for tests and benchmarks: off by default, every draw from one seeded RNG."""

from __future__ import annotations

import random
import threading
from typing import Literal

Drop = Literal["unavailable", "close"]


class FaultInjector:
    """`latency_ms` is added to every answer; `fail_before_rate` answers an operation POST with
    503 before it is journaled; `drop_after_commit_rate` lets the operation be journaled (and
    run) and then replaces its answer with a 503 or a closed connection, half and half."""

    def __init__(
        self,
        *,
        latency_ms: float = 0.0,
        fail_before_rate: float = 0.0,
        drop_after_commit_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.latency_s = max(0.0, latency_ms) / 1000.0
        self.fail_before_rate = fail_before_rate
        self.drop_after_commit_rate = drop_after_commit_rate
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.counts = {"fail_before": 0, "drop_unavailable": 0, "drop_close": 0}

    @property
    def active(self) -> bool:
        return bool(self.latency_s or self.fail_before_rate or self.drop_after_commit_rate)

    def fail_before(self) -> bool:
        if self.fail_before_rate <= 0:
            return False
        with self._lock:
            hit = self._rng.random() < self.fail_before_rate
            if hit:
                self.counts["fail_before"] += 1
            return hit

    def drop_after_commit(self) -> Drop | None:
        if self.drop_after_commit_rate <= 0:
            return None
        with self._lock:
            if self._rng.random() >= self.drop_after_commit_rate:
                return None
            drop: Drop = "close" if self._rng.random() < 0.5 else "unavailable"
            self.counts["drop_" + drop] += 1
            return drop
