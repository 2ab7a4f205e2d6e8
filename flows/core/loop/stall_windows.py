"""Stall windows: how long a training flow run's cycle may go without completing before the
stall automations (deployments/automations.yaml) cancel the run. No Prefect.

A cycle's window is `multiple` x the run's recent cycle time (the mean wall time of its last
`recent_cycles` cycles; `first_window_s` before any), rounded up to the next of the
STALL_WINDOWS_S, the windows the automation file has one proactive automation for (each
window twice the one before, so the rounding at most doubles it). The flows put the window in
each `whitney.cycle.started` event; the automation of that window cancels the flow run if no
`whitney.cycle.completed` of the same window follows within it (flows.core.records.events).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pydantic import Field

from flows.core.fields import Settings

STALL_WINDOWS_S: tuple[int, ...] = tuple(15 * 2**step for step in range(13))
"""15 s, 30 s, 60 s, ... 61440 s (17 h 4 min): one automation each in automations.yaml."""


class StallSettings(Settings):
    """The stall window of each cycle, which the stall automations enforce."""

    multiple: float = Field(
        default=5.0,
        ge=1,
        le=1000,
        description="A cycle that runs this many times the recent cycle time without "
        "completing is a stall: the stall automations cancel the flow run (the window is "
        "rounded up to the next automation's, at most twice as long)",
    )
    recent_cycles: int = Field(
        default=5, ge=1, le=1000, description="The recent cycle time: the mean of this many last"
    )
    first_window_s: float = Field(
        default=900.0,
        ge=0,
        le=STALL_WINDOWS_S[-1],
        description="The window of the first cycle, before any cycle time is known",
    )


def stall_window(settings: StallSettings, cycle_seconds: Sequence[float]) -> int:
    """The window, in seconds, of the next cycle after cycles that took `cycle_seconds`."""
    if cycle_seconds:
        recent = cycle_seconds[-settings.recent_cycles :]
        wanted = settings.multiple * statistics.fmean(recent)
    else:
        wanted = settings.first_window_s
    return next((window for window in STALL_WINDOWS_S if window >= wanted), STALL_WINDOWS_S[-1])
