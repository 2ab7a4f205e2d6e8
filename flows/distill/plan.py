"""The distillation flow's configuration, records and arithmetic, checked before anything is
allocated (no Prefect here).

On-policy distillation with a reverse-KL reward: the student samples completions, a frozen
teacher run scores every sampled token with `logprobs`, and each completion token t gets the
advantage `-kl_coef * (student_lp_t - teacher_lp_t)` (the page's `kl_adjust_advantages` with
zero base advantages), optionally discounted over the tokens after it. The student trains on
`rl_datum`s with per-token advantages and the `importance_sampling` loss. `student_lp_t` is the
sampler's logprob (temperature 1, so it is the student's own distribution); the mean of
`student_lp_t - teacher_lp_t` over a cycle's tokens is `teacher_kl`, a sampled estimate of the
per-token reverse KL(student || teacher), which falls as the student learns the teacher.

Prompts come from the SFT corpus's training split (the built-in corpus, or `data_path`), its
held-out split (`flows.sft.plan.held_out`, the same pairs the teacher's SFT held out) is the
eval set; or from an RL environment's prompts (no eval set).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field, field_validator

from flows.core.adapter import AdapterExport
from flows.core.config import BudgetField, ConfigError, FlowConfig, PricesField
from flows.core.cost import Usage
from flows.core.seeds import derive_seed
from flows.core.task_runner_settings import TaskRunnerSettings, check_task_runner
from flows.sft.config import SFTConfig
from flows.sft.metrics import SFTResult
from whitney.advantages import kl_adjust_advantages
from whitney.losses import PROVIDER_LOSS_SUPPORT, require_advertised_loss
from whitney.payloads import sample_request
from whitney.tokenizers import Tokenizer, get_tokenizer

LOSS_FUNCTION = "importance_sampling"
CORPUS = "corpus"
CHECKPOINT_URI = re.compile(r"^whitney://runs/[A-Za-z0-9_-]+/states/[A-Za-z0-9._-]+$")


def checkpoint_run_id(uri: str) -> str:
    """The run that saved the checkpoint `uri` (whitney://runs/<run>/states/<name>)."""
    if CHECKPOINT_URI.match(uri) is None:
        raise ValueError(f"not a checkpoint: {uri!r} (expected whitney://runs/<run>/states/<name>)")
    return uri.removeprefix("whitney://runs/").split("/", 1)[0]


class DistillationConfig(FlowConfig, TaskRunnerSettings):
    """On-policy distillation: a student run samples, a frozen teacher run answers
    `logprobs` (fanned out in chunks), per-token reverse-KL advantages, importance_sampling."""

    learning_rate: float = Field(default=3e-3, gt=0, le=1, description="AdamW learning rate")
    teacher_checkpoint: str | None = Field(
        default=None,
        pattern=CHECKPOINT_URI.pattern,
        description="The teacher: a checkpoint (whitney://runs/<run>/states/<name>, e.g. an SFT "
        "flow's final checkpoint) loaded into a frozen run; empty: teacher_sft if set, else "
        "the teacher base model itself",
    )
    teacher_sft: SFTConfig | None = Field(
        default=None,
        description="With no teacher_checkpoint: train the teacher first, by an SFT subflow "
        "with this config (its api_url, provider, base model and LoRA rank are the "
        "teacher's), and distill from its final checkpoint",
    )
    teacher_base_model: str | None = Field(
        default=None,
        min_length=1,
        description="The teacher's base model; empty: base_model. It must share the "
        "student's tokenizer",
    )
    teacher_lora_rank: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="The teacher run's LoRA rank (a checkpoint's rank); empty: lora_rank",
    )
    prompts: str = Field(
        default=CORPUS,
        min_length=1,
        description="Where prompts come from: corpus (the training split of data_path, or of "
        "the built-in corpus; its held-out split is the eval set), an RL environment "
        "(digits, lowercase) or an import path module:attr with prompts(cycle, count, seed)",
    )
    data_path: str | None = Field(
        default=None,
        description="prompts=corpus: a JSONL file of {prompt, completion} objects; empty: the "
        "built-in corpus (312 Q/A pairs about 24 animals)",
    )
    eval_fraction: float = Field(
        default=0.1,
        ge=0,
        le=0.5,
        description="prompts=corpus: share held out for the eval loss (0: none); the same "
        "split as an SFT flow on the same data",
    )
    prompts_per_cycle: int = Field(default=8, ge=1, le=1024, description="Prompts per cycle")
    samples_per_prompt: int = Field(
        default=4, ge=1, le=256, description="Completions the student samples per prompt"
    )
    max_tokens: int = Field(default=40, ge=1, le=8192, description="Most tokens per completion")
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

    @property
    def teacher_rank(self) -> int:
        return self.teacher_lora_rank or self.lora_rank

    @property
    def sequences_per_cycle(self) -> int:
        return self.prompts_per_cycle * self.samples_per_prompt

    @property
    def teacher_chunks(self) -> int:
        """Teacher logprobs calls per cycle."""
        size = self.teacher_chunk_size or self.sequences_per_cycle
        return -(-self.sequences_per_cycle // size)

    def teacher_sft_config(self) -> SFTConfig | None:
        """The SFT subflow's config, on the teacher's endpoint, provider, model and rank."""
        if self.teacher_sft is None or self.teacher_checkpoint:
            return None
        update: dict[str, Any] = {
            "api_url": self.api_url,
            "provider": self.provider,
            "base_model": self.teacher_model,
            "lora_rank": self.teacher_rank,
        }
        if self.teacher_sft.metrics_path is None and self.metrics_path:
            update["metrics_path"] = teacher_metrics_path(self.metrics_path)
        return self.teacher_sft.model_copy(update=update)


def teacher_metrics_path(metrics_path: str) -> str:
    """Where the SFT teacher's metrics lines go: beside the distillation's."""
    path = Path(metrics_path)
    return str(path.with_name(path.stem + "-teacher-sft.jsonl"))


# --------------------------------------------------------------------------- records


class EvalLosses(BaseModel):
    """Eval loss per completion token on the held-out split (mean of -logprob, from
    `logprobs` on a sampler of each run)."""

    student_before: float = Field(description="The student before its first cycle")
    student_after: float = Field(description="The student after its last cycle")
    teacher: float
    tokens: int = Field(description="Completion tokens of the eval split")


class DistillCycleMetrics(BaseModel):
    """What a distillation cycle subflow returns (with where the next cycle starts on each
    run), and its record: a table artifact row and a metrics JSON line."""

    cycle: int
    started_at: datetime = Field(description="When the cycle's work began (UTC)")
    seq_start: int = Field(description="First seq id of the cycle on the student run")
    seq_end: int = Field(description="Seq id the next cycle starts at on the student run")
    teacher_seq_start: int = Field(description="First seq id of the cycle on the teacher run")
    teacher_seq_end: int = Field(description="Seq id the next cycle starts at on the teacher")
    teacher_kl: float = Field(
        description="Mean of student minus teacher logprob over the sampled completion tokens "
        "(a sampled per-token reverse KL)"
    )
    advantage_mean: float
    loss: float
    grad_norm: float
    kl_sample_train: float | None = Field(
        description="Mean of sampler minus learner logprob over trained tokens"
    )
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
    op_seconds: dict[str, float] = Field(description="Wall seconds per operation kind")
    wall_seconds: float


class DistillationResult(BaseModel):
    """What `distillation_flow` returns: the student's weights, the teacher, every cycle's
    metrics, the eval losses, and what it all used and cost."""

    session_id: str
    run_id: str = Field(description="The student run")
    teacher_run_id: str
    teacher: str = Field(description="The teacher checkpoint, or base:<model>")
    checkpoint: str = Field(description="The student's final save_state URI")
    adapter: AdapterExport
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
    resumed_from: str | None = None
    teacher_sft: SFTResult | None = Field(
        default=None, description="The SFT flow's result, when the flow trained its teacher"
    )


# --------------------------------------------------------------------------- arithmetic


def reverse_kl_advantages(
    student_logprobs: list[float],
    teacher_logprobs: list[float],
    kl_coef: float,
    discount: float = 0.0,
) -> list[float]:
    """Per-token advantages of one completion: `-kl_coef * (student - teacher)` per token
    (the page's kl_adjust_advantages on zero advantages), then, with a discount, each token
    also gets the discounted sum of the terms after it."""
    terms = kl_adjust_advantages(
        [0.0] * len(student_logprobs), student_logprobs, teacher_logprobs, kl_coef=kl_coef
    )
    if discount == 0.0:
        return terms
    advantages = [0.0] * len(terms)
    running = 0.0
    for index in range(len(terms) - 1, -1, -1):
        running = terms[index] + discount * running
        advantages[index] = running
    return advantages


def completion_logprobs(row: list[float | None], prompt_length: int, count: int) -> list[float]:
    """The logprobs of the `count` completion tokens from a `logprobs` row of the whole
    sequence (prompt + completion; the row's first entry is null)."""
    values = row[prompt_length : prompt_length + count]
    if len(values) != count or any(value is None for value in values):
        raise ValueError(
            f"a logprobs row of {len(row)} entries has no {count} completion logprobs after a "
            f"prompt of {prompt_length} tokens"
        )
    return [float(value) for value in values]  # type: ignore[arg-type]


def chunked(items: list[Any], size: int) -> list[list[Any]]:
    """`items` in consecutive chunks of `size` (0: one chunk of all)."""
    if not items:
        return []
    size = size or len(items)
    return [items[start : start + size] for start in range(0, len(items), size)]


# --------------------------------------------------------------------------- prompts, eval


class PromptSource(Protocol):
    def prompts(self, cycle: int, count: int, seed: int) -> list[str]: ...


@dataclass(frozen=True)
class EvalSequence:
    """One held-out pair as tokens: the prompt, and the completion (with EOS)."""

    prompt: list[int]
    completion: list[int]


class CorpusPrompts:
    """The training split's prompts of an SFT corpus, `count` distinct ones per cycle."""

    def __init__(self, train_prompts: list[str]) -> None:
        self.train_prompts = train_prompts

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        rng = random.Random(seed)
        if count <= len(self.train_prompts):
            return rng.sample(self.train_prompts, count)
        return [rng.choice(self.train_prompts) for _ in range(count)]


def load_corpus(config: DistillationConfig, tokenizer: Tokenizer):
    """(prompt source, eval sequences) of the corpus: its training split's prompts, and its
    held-out split (the SFT flow's split of the same data) as tokens."""
    from flows.sft.corpus import builtin_examples, read_examples
    from flows.sft.plan import example_tokens, held_out

    examples = read_examples(config.data_path) if config.data_path else builtin_examples()
    evaluated = held_out(examples, config.eval_fraction)
    train = sorted({example.prompt for i, example in enumerate(examples) if i not in evaluated})
    if not train:
        raise ConfigError("eval_fraction", "holding out the eval split leaves no prompt")
    eval_set = [
        EvalSequence(*example_tokens(tokenizer, examples[index])) for index in sorted(evaluated)
    ]
    return CorpusPrompts(train), eval_set


def load_prompt_source(config: DistillationConfig, tokenizer: Tokenizer):
    """(prompt source, eval sequences or []) for `config.prompts`; ConfigError if unknown."""
    if config.prompts == CORPUS:
        return load_corpus(config, tokenizer)
    from flows.core.environments import load_environment

    try:
        return load_environment(config.prompts), []
    except ValueError as error:
        raise ConfigError("prompts", str(error).replace("environment", "prompt source")) from None


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class DistillPlan:
    """A distillation config's prompt source, eval set and tokenizer."""

    config: DistillationConfig
    source: PromptSource
    eval_set: list[EvalSequence]
    tokenizer: Tokenizer

    def prompt_tokens(self, prompt: str) -> list[int]:
        bos = getattr(self.tokenizer, "bos_id", None)
        return ([bos] if bos is not None else []) + self.tokenizer.encode(prompt)

    def sample_requests(self, cycle: int) -> list[dict[str, Any]]:
        """One SampleRequest per prompt of the cycle (samples_per_prompt each, temperature
        1), seeded from (config seed, cycle, prompt index)."""
        config = self.config
        prompts = self.source.prompts(
            cycle, config.prompts_per_cycle, derive_seed(config.seed, cycle)
        )
        return [
            sample_request(
                self.prompt_tokens(prompt),
                config.samples_per_prompt,
                max_tokens=config.max_tokens,
                temperature=1.0,
                stop_token_ids=[self.tokenizer.eos_id],
                seed=derive_seed(config.seed, cycle, index),
            )
            for index, prompt in enumerate(prompts)
        ]

    def cycle_usage_bound(self, cycle: int) -> Usage:
        """An upper bound of a cycle's billed usage (every completion max_tokens long), for a
        budget check before any cycle has run."""
        config = self.config
        count, length = config.samples_per_prompt, config.max_tokens
        prompts = [len(r["prompt"]["token_ids"]) for r in self.sample_requests(cycle)]
        return {
            "sample": {"tokens": sum(p + count * length for p in prompts)},
            "logprobs": {"tokens": sum(count * (p + length) for p in prompts)},
            "forward_backward": {"tokens": sum(count * (p + length - 1) for p in prompts)},
        }

    def eval_payload(self) -> dict[str, Any]:
        return {"sequences": [{"token_ids": s.prompt + s.completion} for s in self.eval_set]}

    def eval_loss(self, rows: list[list[float | None]]) -> tuple[float, int]:
        """(mean -logprob per completion token, tokens) of a logprobs answer to eval_payload."""
        total, tokens = 0.0, 0
        for sequence, row in zip(self.eval_set, rows, strict=True):
            values = completion_logprobs(row, len(sequence.prompt), len(sequence.completion))
            total -= sum(values)
            tokens += len(values)
        return total / max(tokens, 1), tokens


def same_tokenizer(student: str, teacher: str) -> bool:
    """Whether the teacher scores the student's token ids: every local/* model shares the
    byte tokenizer; an hf: model only its own."""
    if student.startswith("local/") and teacher.startswith("local/"):
        return True
    return student == teacher


def load_distill_plan(config: DistillationConfig) -> DistillPlan:
    try:
        tokenizer = get_tokenizer(config.base_model)
    except ValueError as error:
        raise ConfigError("base_model", str(error)) from None
    source, eval_set = load_prompt_source(config, tokenizer)
    return DistillPlan(config, source, eval_set, tokenizer)


def check_distill_config(config: DistillationConfig) -> DistillPlan:
    """The plan of a config the provider will accept; ConfigError naming the field if not
    (before anything is allocated)."""
    try:
        require_advertised_loss(config.provider, LOSS_FUNCTION, PROVIDER_LOSS_SUPPORT)
    except ValueError as error:
        raise ConfigError("provider", str(error)) from None
    if not same_tokenizer(config.base_model, config.teacher_model):
        raise ConfigError(
            "teacher_base_model",
            f"{config.teacher_model} does not share the student's tokenizer ({config.base_model})",
        )
    check_task_runner(config)
    plan = load_distill_plan(config)
    if config.teacher_sft is not None and not config.teacher_checkpoint:
        from flows.sft.plan import check_sft_config

        try:
            check_sft_config(config.teacher_sft_config())  # type: ignore[arg-type]
        except ConfigError as error:
            raise ConfigError(f"teacher_sft.{error.field}", error.message) from None
    return plan
