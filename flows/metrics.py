"""The numbers a cycle reports, and what a whole RL flow returns."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class CycleMetrics(BaseModel):
    """What a cycle subflow returns (with `seq_end`, where the next cycle starts), and its
    record: a table artifact row and a metrics JSON line."""

    cycle: int
    started_at: datetime = Field(description="When the cycle's work began (UTC)")
    seq_start: int = Field(description="First seq id of the cycle")
    seq_end: int = Field(description="Seq id the next cycle starts at")
    reward_mean: float
    reward_std: float
    all_zero_group_share: float = Field(
        description="Share of groups with uniform reward: all-zero advantages, no signal"
    )
    loss: float
    grad_norm: float
    kl_sample_train: float | None = Field(
        description="Mean of sampler minus learner logprob over trained tokens"
    )
    tokens_sampled: int
    tokens_trained: int
    op_seconds: dict[str, float] = Field(description="Wall seconds per operation kind")
    wall_seconds: float


class AdapterExport(BaseModel):
    """An exported LoRA adapter on the Whitney server."""

    artifact_id: str
    sha256: str
    bytes: int
    format: str


class RLResult(BaseModel):
    """What `rl_flow` returns: where the trained weights are, and every cycle's metrics."""

    session_id: str
    run_id: str
    checkpoint: str
    adapter: AdapterExport
    cycles: list[CycleMetrics]
