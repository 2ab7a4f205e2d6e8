"""What a sweep returns: every trial's rungs, the best trial. Pure pydantic."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from flows.core.loop.cost import Usage

SKIPPED = "SKIPPED"
"""The state of a trial's rung the budget did not start."""


class TrialRung(BaseModel):
    """What one trial did at one rung."""

    trial: int
    rung: int
    cycles: int = Field(description="Cycles the trial has trained after this rung")
    flow_run_id: str | None = None
    flow_run_name: str
    state: str = Field(description="The flow run's state type, or SKIPPED (budget)")
    curve: list[tuple[int, float]] = Field(
        default_factory=list, description="(cycle, metric) of the rung's cycles"
    )
    score: float | None = Field(default=None, description="The rung's last metric value")
    run_id: str | None = None
    checkpoint: str | None = Field(default=None, description="The rung's final checkpoint")
    usage: Usage = Field(default_factory=dict)
    cost: float | None = None
    started: float | None = Field(default=None, description="Flow run start, epoch seconds")
    ended: float | None = None


class TrialSummary(BaseModel):
    """One trial over the sweep: its values, its rungs in order, how it ended."""

    trial: int
    params: dict[str, Any]
    rungs: list[TrialRung]
    status: str = Field(description="best, finished, stopped at rung r, failed at rung r, ...")

    @property
    def cost(self) -> float | None:
        costs = [rung.cost for rung in self.rungs if rung.cost is not None]
        return sum(costs) if costs else None

    @property
    def last(self) -> TrialRung:
        return self.rungs[-1]


class SweepResult(BaseModel):
    """Every trial, the best one (None: no trial finished) and the sweep's cost."""

    metric: str
    mode: str
    trials: list[TrialSummary]
    best: int | None
    best_checkpoint: str | None
    cost: float | None
