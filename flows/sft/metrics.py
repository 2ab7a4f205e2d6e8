"""The numbers an SFT cycle reports, and what the SFT flow returns."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from flows.core.loop.cycles import CycleResult
from flows.core.loop.training import TrainingResult
from flows.core.records.plots import Line, Panel


class EvalPoint(BaseModel):
    """The eval loss after `step` optimizer steps (0: before training)."""

    step: int
    loss: float = Field(description="Eval loss per trained token: loss / tokens:sum")
    tokens: int = Field(description="Completion tokens of the held-out split")


class SFTCycleMetrics(CycleResult):
    """What an SFT cycle subflow returns (with `seq_end`, where the next cycle starts), and
    its record: the cycle's artifact and a metrics JSON line."""

    step_start: int = Field(description="Optimizer steps done before the cycle")
    step_end: int = Field(description="Optimizer steps done after the cycle")
    epoch: float = Field(description="Passes over the training split done after the cycle")
    train_loss: float = Field(description="Training loss per trained token over the cycle")
    eval_loss: float | None = Field(description="The cycle's latest eval loss per token")
    evals: list[EvalPoint] = Field(description="Every eval loss the cycle measured")
    learning_rate: float = Field(description="Learning rate of the cycle's last step")
    grad_norm: float = Field(description="Mean pre-clip gradient norm over the cycle's steps")
    tokens_trained: int = Field(description="Tokens billed by the cycle's forward_backward")
    checkpoint: str | None = Field(description="The cycle-{n} checkpoint saved after the cycle")


class SFTResult(TrainingResult):
    """What `sft_flow` returns: where the trained weights are, the eval losses, and every
    cycle's metrics."""

    eval_losses: list[float] = Field(description="Eval loss per token, in step order")
    eval_steps: list[int] = Field(description="The step count of each eval loss")
    steps: int = Field(description="Optimizer steps of the run")
    cycles: list[SFTCycleMetrics]


def learning_curves(cycles: Sequence[SFTCycleMetrics]) -> list[Panel]:
    """The SFT summary's picture: the training loss by cycle, the eval loss by step."""
    evals = [(point.step, point.loss) for cycle in cycles for point in cycle.evals]
    return [
        Panel(
            "train loss", "cycle", [Line("train_loss", [(c.cycle, c.train_loss) for c in cycles])]
        ),
        Panel("eval loss", "step", [Line("eval_loss", evals)]),
    ]
