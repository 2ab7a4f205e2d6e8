"""The checkpoint flows' configurations (no Prefect: the UI forms read them).

`EvaluateConfig` is evaluate-checkpoint's: where Whitney is, how tasks retry and cleanup
waits, and what to evaluate (`evaluation`: an environment's held-out prompts and/or the
held-out split of SFT data). `PromoteConfig` adds promote-checkpoint's: which checkpoint (one
given, or the best of a run's by a metric), where the approved model goes, and how long the
approval may take.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.core.config import ApiUrlField, CleanupTimeoutField, TaskRetryField
from flows.core.evaluation.config import EvalSettings
from flows.core.fields import NonEmpty
from whitney.uris import CHECKPOINT_PATTERN

CheckpointURI = Annotated[
    str,
    Field(
        pattern=CHECKPOINT_PATTERN,
        description="A checkpoint: whitney://runs/<run>/states/<name> (a training flow's "
        "cycle-<n> or final save_state)",
    ),
]
Metric = Literal["reward_mean", "sampled_reward_mean", "pass_at_k", "loss"]
LOWER_IS_BETTER: frozenset[str] = frozenset({"loss"})
"""The metrics whose best checkpoint has the least (the others: the most)."""


class EvaluateConfig(BaseModel):
    """Evaluate a checkpoint on a frozen run created from it."""

    model_config = ConfigDict(extra="forbid")

    api_url: ApiUrlField
    evaluation: EvalSettings = Field(
        default_factory=EvalSettings,
        description="The eval set and its sampling: a training flow's checkpoint events carry "
        "its own (the automation passes them), so the numbers match its inline evaluation",
    )
    task_retry: TaskRetryField
    cleanup_timeout_s: CleanupTimeoutField


class PromoteConfig(EvaluateConfig):
    """Evaluate a checkpoint (given, or the best of a run's), pause for a person's approval,
    then export the merged model and the PEFT adapter."""

    checkpoint: CheckpointURI | None = Field(
        default=None, description="The checkpoint to promote; or give run_id"
    )
    run_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Promote the best of every checkpoint this Whitney run saved, by `metric`",
    )
    metric: Metric = Field(
        default="reward_mean",
        description="What `best` means with run_id: the most reward_mean (greedy), "
        "sampled_reward_mean or pass_at_k, or the least loss (needs evaluation.data)",
    )
    target_dir: NonEmpty = Field(
        default="promoted",
        description="Where an approved checkpoint goes, on the worker: target_dir/merged (one "
        "model, the LoRA merged in) and target_dir/adapter (PEFT, its base model inside); "
        "both must be new or empty",
    )
    approval_timeout_s: int = Field(
        default=86_400,
        ge=2,
        le=30 * 86_400,
        description="How long the run waits, paused, for the approval form; then it ends "
        "without exporting",
    )

    @model_validator(mode="after")
    def _one_checkpoint_or_a_run(self) -> Self:
        if (self.checkpoint is None) == (self.run_id is None):
            raise ValueError("give exactly one of checkpoint and run_id")
        if self.metric == "loss" and self.evaluation.data is None:
            raise ValueError("metric loss needs evaluation.data (SFT data for the eval loss)")
        return self
