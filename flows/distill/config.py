"""The distillation flow's configuration, checked before anything is allocated (no Prefect)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from flows.core.config import BudgetField, FlowConfig, MaxStalenessField, PricesField
from flows.core.evaluation.config import CORPUS as EVAL_CORPUS
from flows.core.evaluation.config import EvalSettings
from flows.core.fields import (
    EveryCycles,
    GroupSize,
    LearningRate,
    LoraRank,
    MaxTokens,
    NonEmpty,
    PromptsPerCycle,
)
from flows.core.orchestration.task_runner_settings import TaskRunnerSettings
from flows.sft.config import EvalFraction, SFTConfig
from whitney.renderers import RendererName
from whitney.uris import CHECKPOINT_PATTERN

LOSS_FUNCTION = "importance_sampling"
CORPUS = "corpus"


class DistillationConfig(FlowConfig, TaskRunnerSettings):
    """On-policy distillation: a student run samples, a frozen teacher run answers
    `logprobs` (fanned out in chunks), per-token reverse-KL advantages, importance_sampling."""

    RENAMED: ClassVar[dict[str, str]] = {"samples_per_prompt": "group_size"}

    learning_rate: LearningRate = 3e-3
    teacher_checkpoint: str | None = Field(
        default=None,
        pattern=CHECKPOINT_PATTERN,
        description="The teacher: a checkpoint (whitney://runs/<run>/states/<name>, e.g. an SFT "
        "flow's final checkpoint) loaded into a frozen run; empty: teacher_sft if set, else "
        "the teacher base model itself",
    )
    teacher_sft: SFTConfig | None = Field(
        default=None,
        description="With no teacher_checkpoint: train the teacher first, by an SFT subflow "
        "with this config (its api_url, provider, base model, tokenizer, renderer and LoRA "
        "rank are the teacher's), and distill from its final checkpoint",
    )
    teacher_base_model: NonEmpty | None = Field(
        default=None,
        description="The teacher's base model; empty: base_model. It must share the "
        "student's tokenizer",
    )
    teacher_renderer: RendererName | None = Field(
        default=None,
        description="The teacher's renderer; empty: renderer. Distillation refuses a teacher "
        "whose renderer differs from the student's (it would score the student's tokens in a "
        "format it does not use)",
    )
    teacher_lora_rank: LoraRank | None = Field(
        default=None,
        description="The teacher run's LoRA rank (a checkpoint's rank); empty: lora_rank",
    )
    prompts: NonEmpty = Field(
        default=CORPUS,
        description="Where prompts come from: corpus (the training split of data_path, or of "
        "the built-in corpus; its held-out split is the eval set), an RL environment "
        "(arithmetic, digits, lowercase) or an import path module:attr with "
        "prompts(cycle, count, seed)",
    )
    data_path: str | None = Field(
        default=None,
        description="prompts=corpus: a JSONL file of {prompt, completion} objects; empty: the "
        "built-in corpus (312 Q/A pairs about 24 animals)",
    )
    eval_fraction: EvalFraction = 0.1  # with prompts=corpus
    prompts_per_cycle: PromptsPerCycle = Field(default=8, description="Prompts per cycle")
    group_size: GroupSize = Field(
        default=4,
        description="Completions the student samples per prompt (a group; formerly "
        "samples_per_prompt)",
    )
    max_tokens: MaxTokens = 40
    kl_coef: float = Field(
        default=1.0, gt=0, le=100, description="Advantage = -kl_coef * (student - teacher lp)"
    )
    discount: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Discount of later tokens' rewards in a token's advantage (0: each token "
        "only its own reverse-KL term; 1: the sum over the rest of the completion)",
    )
    teacher_chunk_size: int = Field(
        default=4,
        ge=0,
        le=100_000,
        description="Sequences per teacher logprobs call, one task each (0: all of a cycle's "
        "sequences in one call)",
    )
    teacher_fan_out: bool = Field(
        default=True,
        description="Submit a cycle's teacher logprobs calls together (a reserved block of the "
        "teacher run's seq ids, run concurrently by the task runner); off: one after another, "
        "with the same seq ids",
    )
    concurrent_sampling: bool = Field(
        default=True,
        description="Submit the student's save_weights_for_sampler and sample requests "
        "together (a reserved block of seq ids)",
    )
    eval_every: EveryCycles = Field(
        default=0,
        description="Evaluate the student after every this many cycles and after the last, on "
        "a sampler of its own: the held-out prompts sampled greedily and group_size "
        "times (eval.reward_mean, eval.pass_at_k) and, with prompts=corpus, its eval loss "
        "(eval.loss); 0: never. Training is the same either way",
    )
    max_staleness: MaxStalenessField
    budget: BudgetField
    prices: PricesField

    @field_validator("teacher_sft")
    @classmethod
    def _sft_teacher_is_fresh(cls, value: SFTConfig | None) -> SFTConfig | None:
        if value is not None and value.resume_from:
            raise ValueError("the SFT teacher starts from its base model: no resume_from")
        return value

    @property
    def teacher_model(self) -> str:
        return self.teacher_base_model or self.base_model

    def served_models(self) -> dict[str, str]:
        return {"base_model": self.base_model, "teacher_base_model": self.teacher_model}

    @property
    def teacher_rendering(self) -> str:
        """The teacher's renderer setting (its own, else the student's)."""
        return self.teacher_renderer or self.renderer

    @property
    def teacher_rank(self) -> int:
        return self.teacher_lora_rank or self.lora_rank

    @property
    def sequences_per_cycle(self) -> int:
        return self.prompts_per_cycle * self.group_size

    @property
    def teacher_chunks(self) -> int:
        """Teacher logprobs calls per cycle."""
        size = self.teacher_chunk_size or self.sequences_per_cycle
        return -(-self.sequences_per_cycle // size)

    def eval_settings(self) -> EvalSettings | None:
        """With prompts=corpus, the held-out pairs (rewarded by similarity to their reference,
        and scored for the eval loss; None when eval_fraction holds none out); else the prompt
        source's held-out prompts."""
        if self.prompts == CORPUS:
            if self.eval_fraction == 0:
                return None
            source = {"env": None, "data": self.data_path or EVAL_CORPUS}
        else:
            source = {"env": self.prompts, "data": None}
        return self.evaluation(
            **source,
            eval_fraction=self.eval_fraction or EvalSettings().eval_fraction,
            group_size=self.group_size,
            max_tokens=self.max_tokens,
            temperature=1.0,
        )

    def teacher_sft_config(self) -> SFTConfig | None:
        """The SFT subflow's config, on the teacher's endpoint, provider, model and rank."""
        if self.teacher_sft is None or self.teacher_checkpoint:
            return None
        update: dict[str, Any] = {
            "api_url": self.api_url,
            "provider": self.provider,
            "base_model": self.teacher_model,
            "tokenizer": self.tokenizer,
            "renderer": self.teacher_rendering,
            "lora_rank": self.teacher_rank,
        }
        if self.teacher_sft.metrics_path is None and self.metrics_path:
            update["metrics_path"] = teacher_metrics_path(self.metrics_path)
        return self.teacher_sft.model_copy(update=update)


def teacher_metrics_path(metrics_path: str) -> str:
    """Where the SFT teacher's metrics lines go: beside the distillation's."""
    path = Path(metrics_path)
    return str(path.with_name(path.stem + "-teacher-sft.jsonl"))
