"""Learning-rate schedules: constant, linear or cosine decay, each after a linear warmup.

With `base` the configured rate, `total` the number of optimizer steps and `warmup` the
warmup steps, the rate of step `s` (0-based) is

    s < warmup:        base * (s + 1) / warmup
    otherwise:         base * f(p),  p = (s - warmup) / (total - warmup)  in [0, 1)
        constant       f(p) = 1
        linear         f(p) = 1 - p
        cosine         f(p) = (1 + cos(pi * p)) / 2

so the first step after warmup trains at `base` and the last one at a small positive rate,
never 0 (no step is wasted). Pure functions: a replayed step sends the same rate.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

ScheduleName = Literal["constant", "linear", "cosine"]
SCHEDULES: tuple[str, ...] = get_args(ScheduleName)


def decay_factor(schedule: str, progress: float) -> float:
    """f(p) of the schedule at `progress` p in [0, 1]."""
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must be within [0, 1], got {progress}")
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")


def scheduled_rate(schedule: str, base: float, step: int, total: int, warmup: int = 0) -> float:
    """The learning rate of optimizer step `step` (0-based) of `total`."""
    if total < 1:
        raise ValueError(f"total must be at least 1, got {total}")
    if not 0 <= step < total:
        raise ValueError(f"step must be within [0, {total}), got {step}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if step < warmup:
        return base * (step + 1) / warmup
    return base * decay_factor(schedule, (step - warmup) / (total - warmup))
