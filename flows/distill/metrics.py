"""What the distillation flow records: each cycle's metrics, the eval losses, its result."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from flows.core.evaluation.plan import EvalMetrics
from flows.core.loop.cost import Usage
from flows.core.loop.cycles import CycleResult
from flows.core.loop.off_policy_schedule import (
    KlSampleTrainField,
    PresampledField,
    StalenessField,
)
from flows.core.loop.training import TrainingResult
from flows.core.records.plots import Line, Panel
from flows.sft.metrics import SFTResult


class EvalLosses(BaseModel):
    """Eval loss per completion token on the held-out split (mean of -logprob, from
    `logprobs` on a sampler of each run)."""

    student_before: float = Field(description="The student before its first cycle")
    student_after: float = Field(description="The student after its last cycle")
    teacher: float
    tokens: int = Field(description="Completion tokens of the eval split")


class DistillCycleMetrics(CycleResult):
    """What a distillation cycle subflow returns (with where the next cycle starts on each
    run), and its record: the cycle's artifact and a metrics JSON line."""

    seq_start: int = Field(description="First seq id of the cycle on the student run")
    seq_end: int = Field(description="Seq id the next cycle starts at on the student run")
    teacher_seq_start: int = Field(description="First seq id of the cycle on the teacher run")
    teacher_seq_end: int = Field(description="Seq id the next cycle starts at on the teacher")
    teacher_kl: float = Field(
        description="Mean of student minus teacher logprob over the sampled completion tokens "
        "(a sampled per-token reverse KL)"
    )
    advantage_mean: float
    sampler_id: str = Field(default="", description="The student sampler the cycle sampled from")
    staleness: StalenessField
    presampled: PresampledField
    loss: float
    grad_norm: float
    kl_sample_train: KlSampleTrainField
    sequences: int
    teacher_chunks: int = Field(description="Teacher logprobs calls (tasks) in the cycle")
    tokens_sampled: int
    tokens_teacher: int = Field(description="Tokens the teacher's logprobs calls billed")
    tokens_trained: int
    teacher_seconds: float = Field(description="Wall time of the teacher phase")
    checkpoint: str | None = Field(default=None, description="The cycle-{n} checkpoint, if saved")
    usage: Usage = Field(description="Billed usage per operation kind, both runs")
    teacher_usage: Usage = Field(description="The part of `usage` billed on the teacher run")
    cost: float | None = Field(default=None, description="Estimated USD, with a price table")
    eval: EvalMetrics | None = Field(
        default=None, description="The inline evaluation of the student after the cycle"
    )


class DistillationResult(TrainingResult):
    """What `distillation_flow` returns: the student's weights, the teacher, every cycle's
    metrics, the eval losses, and what it all used and cost."""

    run_id: str = Field(description="The student run")
    teacher_run_id: str
    teacher: str = Field(description="The teacher checkpoint, or base:<model>")
    cycles: list[DistillCycleMetrics]
    eval: EvalLosses | None = None
    usage: dict[str, Usage] = Field(
        description="Billed usage per run of this flow run: student, teacher, and teacher_sft "
        "when the teacher was trained by SFT (by this attempt or an earlier one)"
    )
    total_tokens: int
    cost: float | None = None
    budget_stop: str | None = Field(
        default=None, description="Why the flow stopped before its last cycle, if it did"
    )
    teacher_sft: SFTResult | None = Field(
        default=None, description="The SFT flow's result, when the flow trained its teacher"
    )


def learning_curves(cycles: Sequence[DistillCycleMetrics]) -> list[Panel]:
    """The distillation summary's picture: teacher_kl and loss by cycle, and the inline
    evaluations (the student's eval loss, its rewards on the held-out prompts)."""
    evaluated = [(cycle.cycle, cycle.eval) for cycle in cycles if cycle.eval is not None]
    panels = [
        Panel(
            "teacher_kl", "cycle", [Line("teacher_kl", [(c.cycle, c.teacher_kl) for c in cycles])]
        ),
        Panel("loss", "cycle", [Line("loss", [(c.cycle, c.loss) for c in cycles])]),
    ]
    if evaluated:
        losses = [(n, e.loss) for n, e in evaluated if e.loss is not None]
        panels.append(Panel("eval loss (student)", "cycle", [Line("eval.loss", losses)]))
        rewards = [
            Line(f"eval.{name}", [(n, getattr(e, name)) for n, e in evaluated])
            for name in ("reward_mean", "pass_at_k")
        ]
        panels.append(Panel("eval (held-out prompts)", "cycle", rewards))
    return panels
