"""What the DPO flow records: each cycle's preference numbers, the held-out evaluations, and
its result."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from flows.core.loop.cost import Usage
from flows.core.loop.cycles import CycleResult
from flows.core.loop.training import TrainingResult
from flows.core.records.plots import Line, Panel
from flows.dpo.objective import PreferenceStats


class PreferenceEval(BaseModel):
    """The DPO numbers of the held-out pairs under the policy's current weights."""

    accuracy: float = Field(description="Preference accuracy: share of pairs with margin > 0")
    chosen_preferred: float = Field(
        description="Share of pairs whose chosen answer the policy finds more likely than the "
        "rejected one (summed logprobs, no reference)"
    )
    loss: float = Field(description="Mean DPO loss")
    margin: float = Field(description="Mean margin")
    chosen_drift: float = Field(description="Mean policy minus reference logprob, chosen")
    rejected_drift: float = Field(description="Mean policy minus reference logprob, rejected")
    pairs: int

    @classmethod
    def of(cls, stats: PreferenceStats) -> PreferenceEval:
        """The held-out numbers: the fields of `stats` of the same names."""
        return cls.model_validate(stats, from_attributes=True)


class DPOCycleMetrics(CycleResult):
    """What a DPO cycle subflow returns, and its record (the cycle's artifact and a metrics
    JSON line): the batch's DPO numbers before the step, and the held-out ones after it."""

    loss: float = Field(description="Mean DPO loss of the cycle's pairs (before its step)")
    reward_accuracy: float = Field(description="Share of the cycle's pairs with margin > 0")
    margin: float = Field(description="Mean margin beta * (chosen - rejected drift)")
    chosen_reward: float = Field(description="Mean beta * (policy - reference), chosen")
    rejected_reward: float = Field(description="Mean beta * (policy - reference), rejected")
    chosen_drift: float = Field(description="Mean policy minus reference logprob, chosen")
    rejected_drift: float = Field(description="Mean policy minus reference logprob, rejected")
    kl_sample_train: float | None = Field(
        description="forward_backward's mean of forward minus learner logprob: 0.0 when the "
        "two computations are the same bits (the ratio is exactly 1)"
    )
    grad_norm: float
    pairs: int
    tokens_trained: int
    checkpoint: str | None = Field(default=None, description="The cycle-{n} checkpoint, if saved")
    usage: Usage = Field(description="Billed usage per operation kind")
    cost: float | None = Field(default=None, description="Estimated USD, with a price table")
    eval_before: PreferenceEval | None = Field(
        default=None, description="The held-out pairs before the flow run's first cycle"
    )
    eval: PreferenceEval | None = Field(
        default=None, description="The held-out pairs after the cycle's step, when due"
    )


class DPOResult(TrainingResult):
    """What `dpo_flow` returns: the policy's weights, the reference, every cycle's metrics,
    and what it all used and cost."""

    reference_run_id: str
    reference: str = Field(description="The reference checkpoint, or base:<model>")
    cycles: list[DPOCycleMetrics]
    eval_before: PreferenceEval | None = None
    eval_after: PreferenceEval | None = None
    total_tokens: int
    cost: float | None = None
    budget_stop: str | None = Field(
        default=None, description="Why the flow stopped before its last cycle, if it did"
    )


def learning_curves(cycles: Sequence[DPOCycleMetrics]) -> list[Panel]:
    """The DPO summary's picture: loss and margin by cycle, and the held-out accuracy."""
    panels = [
        Panel("DPO loss", "cycle", [Line("loss", [(c.cycle, c.loss) for c in cycles])]),
        Panel(
            "drift from the reference",
            "cycle",
            [
                Line("chosen_drift", [(c.cycle, c.chosen_drift) for c in cycles]),
                Line("rejected_drift", [(c.cycle, c.rejected_drift) for c in cycles]),
            ],
        ),
    ]
    evaluated = [(c.cycle, c.eval.accuracy) for c in cycles if c.eval is not None]
    if evaluated:
        panels.append(Panel("held-out accuracy", "cycle", [Line("eval.accuracy", evaluated)]))
    return panels
