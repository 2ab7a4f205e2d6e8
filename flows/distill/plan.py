"""The distillation flow's plan and arithmetic, checked before anything is allocated (no
Prefect here).

On-policy distillation with a reverse-KL reward: the student samples completions, a frozen
teacher run scores every sampled token with `logprobs`, and each completion token t gets the
advantage `-kl_coef * (student_lp_t - teacher_lp_t)` (`kl_adjust_advantages` of Whitney's Loop
building blocks, with zero base advantages), optionally discounted over the tokens after it. The
student trains on `rl_datum`s with per-token advantages and the `importance_sampling` loss.
`student_lp_t` is the sampler's logprob (temperature 1, so it is the student's own
distribution); the mean of `student_lp_t - teacher_lp_t` over a cycle's tokens is `teacher_kl`,
a sampled estimate of the per-token reverse KL(student || teacher), which falls as the student
learns the teacher.

Prompts come from the SFT corpus's training split (the built-in corpus, or `data_path`), its
held-out split (`flows.sft.plan.held_out`, the same pairs the teacher's SFT held out) is the
eval set; or from an RL environment's prompts (no eval set).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

from flows.core.config import ConfigError, check_max_staleness, check_resume_from
from flows.core.environments.rendering import config_renderer, load_renderer
from flows.core.evaluation.plan import (
    EvalPlan,
    HeldOutPair,
    load_eval_plan,
    loss_per_token,
    prompt_key,
)
from flows.core.loop.cost import Usage
from flows.core.loop.plans import derive_seed, once_per_process
from flows.core.orchestration.task_runner_settings import check_task_runner
from flows.distill.config import CORPUS, LOSS_FUNCTION, DistillationConfig
from whitney.advantages import kl_adjust_advantages
from whitney.losses import PROVIDER_LOSS_SUPPORT, require_advertised_loss
from whitney.payloads import sample_request
from whitney.renderers import Prompt, Renderer, as_messages

# --------------------------------------------------------------------------- arithmetic


def reverse_kl_advantages(
    student_logprobs: list[float],
    teacher_logprobs: list[float],
    kl_coef: float,
    discount: float = 0.0,
) -> list[float]:
    """Per-token advantages of one completion: `-kl_coef * (student - teacher)` per token
    (kl_adjust_advantages on zero advantages), then, with a discount, each token also gets
    the discounted sum of the terms after it."""
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


def chunked(items: list[Any], size: int) -> list[list[Any]]:
    """`items` in consecutive chunks of `size` (0: one chunk of all)."""
    if not items:
        return []
    size = size or len(items)
    return [items[start : start + size] for start in range(0, len(items), size)]


# --------------------------------------------------------------------------- prompts, eval


class PromptSource(Protocol):
    def prompts(self, cycle: int, count: int, seed: int) -> list[Prompt]: ...


@dataclass(frozen=True)
class EvalSequence:
    """One held-out pair as tokens: the prompt, and the completion (with EOS)."""

    prompt: list[int]
    completion: list[int]


class CorpusPrompts:
    """The training split's prompts of an SFT corpus, `count` distinct ones per cycle."""

    def __init__(self, train_prompts: list[Prompt]) -> None:
        self.train_prompts = train_prompts

    def prompts(self, cycle: int, count: int, seed: int) -> list[Prompt]:
        rng = random.Random(seed)
        if count <= len(self.train_prompts):
            return rng.sample(self.train_prompts, count)
        return [rng.choice(self.train_prompts) for _ in range(count)]


def load_corpus(config: DistillationConfig, renderer: Renderer):
    """(prompt source, eval sequences, held-out pairs) of the corpus: its training split's
    distinct prompts (a conversation's: the messages before its last assistant turn), and its
    held-out split (the SFT flow's split of the same data) as tokens, the last assistant turn
    the completion, and as text."""
    from flows.sft.corpus import builtin_examples, read_examples
    from flows.sft.plan import example_tokens, held_out

    examples = read_examples(config.data_path) if config.data_path else builtin_examples()
    evaluated = held_out(examples, config.eval_fraction)
    distinct = {
        prompt_key(example.prompt): example.prompt
        for index, example in enumerate(examples)
        if index not in evaluated
    }
    train = [distinct[key] for key in sorted(distinct)]
    if not train:
        raise ConfigError("eval_fraction", "holding out the eval split leaves no prompt")
    try:
        eval_set = [
            EvalSequence(*example_tokens(renderer, examples[index])) for index in sorted(evaluated)
        ]
    except ValueError as error:
        raise ConfigError("data_path", str(error)) from None
    pairs = [
        HeldOutPair(example.prompt, example.completion, tuple(example.conversation()))
        for example in (examples[index] for index in sorted(evaluated))
    ]
    return CorpusPrompts(train), eval_set, pairs


def load_prompt_source(config: DistillationConfig, renderer: Renderer):
    """(prompt source, eval sequences or [], held-out pairs or []) for `config.prompts`;
    ConfigError if unknown."""
    if config.prompts == CORPUS:
        return load_corpus(config, renderer)
    from flows.core.environments import load_environment

    try:
        source = load_environment(config.prompts)
    except ValueError as error:
        raise ConfigError("prompts", str(error).replace("environment", "prompt source")) from None
    if not callable(getattr(source, "prompts", None)):
        raise ConfigError(
            "prompts",
            f"{config.prompts} is a multi-turn environment: a prompt source needs "
            "prompts(cycle, count, seed)",
        )
    return source, [], []


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class DistillPlan:
    """A distillation config's prompt source, eval set and renderer (the student's, which the
    teacher's must equal)."""

    config: DistillationConfig
    source: PromptSource
    eval_set: list[EvalSequence]
    renderer: Renderer
    evaluation: EvalPlan | None = None
    """The inline evaluation's eval set (None with eval_every 0)."""

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        return self.renderer.build_generation_prompt(as_messages(prompt))

    def sample_requests(self, cycle: int) -> list[dict[str, Any]]:
        """One SampleRequest per prompt of the cycle (group_size each, temperature
        1), seeded from (config seed, cycle, prompt index)."""
        config = self.config
        prompts = self.source.prompts(
            cycle, config.prompts_per_cycle, derive_seed(config.seed, cycle)
        )
        return [
            sample_request(
                self.prompt_tokens(prompt),
                config.group_size,
                max_tokens=config.max_tokens,
                temperature=1.0,
                stop_token_ids=list(self.renderer.stop_tokens),
                seed=derive_seed(config.seed, cycle, index),
            )
            for index, prompt in enumerate(prompts)
        ]

    def cycle_usage_bound(self, cycle: int) -> Usage:
        """An upper bound of a cycle's billed usage (every completion max_tokens long), for a
        budget check before any cycle has run."""
        config = self.config
        count, length = config.group_size, config.max_tokens
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
        return loss_per_token([(s.prompt, s.completion) for s in self.eval_set], rows)


def same_tokenizer(student: str, teacher: str) -> bool:
    """Whether the teacher scores the student's token ids: every local/* model shares the
    byte tokenizer; a Hugging Face model only its own (unless the `tokenizer` setting names
    the one both use)."""
    if student.startswith("local/") and teacher.startswith("local/"):
        return True
    return student == teacher


def check_same_renderer(config: DistillationConfig, student: Renderer) -> None:
    """ConfigError naming `renderer` and `teacher_renderer` unless the teacher renders as the
    student does: the teacher scores the student's tokens, so a teacher trained or prompted in
    another format would give biased logprobs."""
    fields = ("teacher_base_model", "tokenizer", "teacher_renderer")
    teacher = load_renderer(
        config.teacher_model, config.tokenizer, config.teacher_rendering, fields
    )
    if teacher.signature != student.signature:
        raise ConfigError(
            "teacher_renderer",
            f"the teacher's renderer ({teacher.signature}: teacher_renderer="
            f"{config.teacher_rendering} on {config.teacher_model}) differs from the student's "
            f"({student.signature}: renderer={config.renderer} on {config.base_model}); the "
            "teacher would score the student's tokens in another format, biasing its logprobs: "
            "give renderer and teacher_renderer the same value",
        )


def load_distill_plan(config: DistillationConfig) -> DistillPlan:
    renderer = config_renderer(config)
    source, eval_set, pairs = load_prompt_source(config, renderer)
    evaluation = None
    if config.eval_every:
        settings = config.eval_settings()
        if settings is None:
            raise ConfigError("eval_every", "prompts=corpus with eval_fraction 0 hold none out")
        try:
            evaluation = load_eval_plan(settings, renderer, pairs)
        except ConfigError as error:
            raise ConfigError("prompts", error.message) from None
    return DistillPlan(config, source, eval_set, renderer, evaluation)


@once_per_process
def check_distill_config(config: DistillationConfig) -> DistillPlan:
    """The plan of a config the provider will accept; ConfigError naming the field if not
    (before anything is allocated)."""
    check_resume_from(config.resume_from, config.cycles)
    check_max_staleness(config.max_staleness, concurrent_sampling=config.concurrent_sampling)
    try:
        require_advertised_loss(config.provider, LOSS_FUNCTION, PROVIDER_LOSS_SUPPORT)
    except ValueError as error:
        raise ConfigError("provider", str(error)) from None
    if not config.tokenizer and not same_tokenizer(config.base_model, config.teacher_model):
        raise ConfigError(
            "teacher_base_model",
            f"{config.teacher_model} does not share the student's tokenizer ({config.base_model})",
        )
    check_task_runner(config)
    plan = load_distill_plan(config)
    check_same_renderer(config, plan.renderer)
    if config.teacher_sft is not None and not config.teacher_checkpoint:
        from flows.sft.plan import check_sft_config

        try:
            check_sft_config(config.teacher_sft_config())  # type: ignore[arg-type]
        except ConfigError as error:
            raise ConfigError(f"teacher_sft.{error.field}", error.message) from None
    return plan
