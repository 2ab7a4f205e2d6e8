"""An eval set as requests, and its numbers from their answers (no Prefect).

    greedy      one `sample` per held-out prompt: 1 completion, `top_k: 1`
    sampled     one `sample` per held-out prompt: k = `group_size` completions at `temperature`
    loss        `logprobs` of the held-out pairs of SFT data (their last assistant turn)

The numbers (`EvalMetrics`): `reward_mean`, the mean reward of the greedy completions;
`sampled_reward_mean`, of all k x prompts sampled ones; `pass_at_k`, the share of prompts
with at least one of their k samples rewarded `pass_reward` or more (with n = k samples the
unbiased pass@k estimator is exactly that); `loss`, the mean of -logprob over the held-out
completion tokens. Prompts are rendered, and completions parsed, by the renderer training
uses (`EvalSettings.renderer`). Rewards come from the environment, or, with no environment,
from the similarity of a completion to the reference completion of its held-out pair.
"""

from __future__ import annotations

import difflib
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from flows.core.config import ConfigError
from flows.core.environments import (
    EVAL_CYCLE,
    Completion,
    held_out_prompts,
    load_environment,
)
from flows.core.evaluation.config import EvalSettings
from flows.core.loop.plans import derive_seed
from whitney.payloads import sample_request
from whitney.renderers import Message, Prompt, Renderer, as_messages

GREEDY, SAMPLED = 0, 1
"""The seed streams of an eval prompt's two requests: derive_seed(seed, EVAL_CYCLE, i, stream)."""
LOGPROBS_CHUNK = 64
"""Held-out sequences per `logprobs` call."""


class EvalMetrics(BaseModel):
    """What an evaluation measured (the `eval` object of a cycle's metrics line)."""

    reward_mean: float = Field(description="Mean reward of the greedy (top_k 1) completions")
    sampled_reward_mean: float = Field(
        description="Mean reward of the k completions per prompt sampled at the temperature"
    )
    pass_at_k: float = Field(
        description="Share of prompts with a sampled completion rewarded pass_reward or more"
    )
    k: int = Field(description="Samples per prompt at the temperature")
    prompts: int = Field(description="Held-out prompts")
    loss: float | None = Field(
        default=None, description="Eval loss per token on the held-out SFT pairs (with data)"
    )
    loss_tokens: int | None = Field(default=None, description="Completion tokens of `loss`")
    seconds: float | None = Field(default=None, description="Wall seconds of the evaluation")


@dataclass(frozen=True)
class HeldOutPair:
    """One held-out example of SFT data: its prompt (text, or the messages before its last
    assistant turn), that turn's content, and the whole conversation."""

    prompt: Prompt
    completion: str
    conversation: tuple[Message, ...]


def prompt_key(prompt: Prompt) -> str:
    """A prompt's sort key: its text, or its messages as canonical JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


class ReferenceSimilarity:
    """The reward of a held-out pair's prompt with no environment: the similarity of the
    completion to the pair's reference completion (difflib's ratio, 1.0 exactly when equal);
    a prompt held out with several references gets the best."""

    def __init__(self, pairs: Sequence[HeldOutPair]) -> None:
        self.references: dict[str, list[str]] = {}
        for pair in pairs:
            self.references.setdefault(prompt_key(pair.prompt), []).append(pair.completion)

    def reward(self, prompt: Prompt, completion: Completion) -> float:
        return max(
            difflib.SequenceMatcher(None, completion.text, reference, autojunk=False).ratio()
            for reference in self.references[prompt_key(prompt)]
        )


@dataclass(frozen=True)
class EvalPlan:
    """An eval set's prompts, reward and loss sequences, as requests and numbers."""

    settings: EvalSettings
    renderer: Renderer
    prompts: list[Prompt]
    reward: Callable[[Prompt, Completion], float]
    sequences: list[tuple[list[int], list[int]]]
    """(prompt tokens, completion tokens) of each held-out pair scored for the loss: its last
    assistant turn as the renderer renders it (raw: BOS + prompt, completion + EOS)."""

    def requests(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(greedy requests, sampled requests), one of each per prompt, in prompt order."""
        settings = self.settings
        greedy, sampled = [], []
        for index, prompt in enumerate(self.prompts):
            tokens = self.renderer.build_generation_prompt(as_messages(prompt))
            common = {
                "max_tokens": settings.max_tokens,
                "stop_token_ids": list(self.renderer.stop_tokens),
            }
            greedy.append(
                sample_request(
                    tokens,
                    1,
                    top_k=1,
                    seed=derive_seed(settings.seed, EVAL_CYCLE, index, GREEDY),
                    **common,
                )
            )
            sampled.append(
                sample_request(
                    tokens,
                    settings.group_size,
                    temperature=settings.temperature,
                    seed=derive_seed(settings.seed, EVAL_CYCLE, index, SAMPLED),
                    **common,
                )
            )
        return greedy, sampled

    def logprobs_payloads(self) -> list[dict[str, Any]]:
        """The `logprobs` payloads of the loss sequences, LOGPROBS_CHUNK at a time."""
        sequences = [{"token_ids": prompt + completion} for prompt, completion in self.sequences]
        return [
            {"sequences": sequences[start : start + LOGPROBS_CHUNK]}
            for start in range(0, len(sequences), LOGPROBS_CHUNK)
        ]

    def rewards(self, prompt: Prompt, sample: dict[str, Any]) -> list[float]:
        """The reward of each sequence of a `sample` result for `prompt` (its text: what the
        renderer parses before the stop token)."""
        return [
            float(
                self.reward(
                    prompt,
                    Completion(
                        self.renderer.parse_response(sequence["tokens"])["content"],
                        sequence["stop_reason"] == "stop",
                    ),
                )
            )
            for sequence in sample["sequences"]
        ]

    def score(
        self,
        greedy: Sequence[dict[str, Any]],
        sampled: Sequence[dict[str, Any]],
        logprobs: Sequence[list[float | None]] = (),
    ) -> EvalMetrics:
        """The numbers of the answers to `requests()` (and to `logprobs_payloads()`, rows in
        order, when there are loss sequences)."""
        settings = self.settings
        best = [self.rewards(p, s) for p, s in zip(self.prompts, greedy, strict=True)]
        drawn = [self.rewards(p, s) for p, s in zip(self.prompts, sampled, strict=True)]
        metrics = EvalMetrics(
            reward_mean=statistics.fmean(r for rewards in best for r in rewards),
            sampled_reward_mean=statistics.fmean(r for rewards in drawn for r in rewards),
            pass_at_k=statistics.fmean(
                any(r >= settings.pass_reward for r in rewards) for rewards in drawn
            ),
            k=settings.group_size,
            prompts=len(self.prompts),
        )
        if self.sequences:
            loss, tokens = loss_per_token(self.sequences, logprobs)
            metrics = metrics.model_copy(update={"loss": loss, "loss_tokens": tokens})
        return metrics


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


def loss_per_token(
    sequences: Sequence[tuple[list[int], list[int]]], rows: Sequence[list[float | None]]
) -> tuple[float, int]:
    """(mean -logprob per completion token, completion tokens) of (prompt, completion)
    sequences from their `logprobs` rows."""
    total, tokens = 0.0, 0
    for (prompt, completion), row in zip(sequences, rows, strict=True):
        total -= sum(completion_logprobs(row, len(prompt), len(completion)))
        tokens += len(completion)
    return total / max(tokens, 1), tokens


def eval_due(cycle: int, every: int, cycles: int) -> bool:
    """Whether the weights after cycle `cycle` are evaluated inline: after every `every`
    cycles and after the last (`every` 0: never)."""
    return every > 0 and ((cycle + 1) % every == 0 or cycle == cycles - 1)


def load_eval_plan(
    settings: EvalSettings, renderer: Renderer, pairs: Sequence[HeldOutPair] = ()
) -> EvalPlan:
    """The eval set of `settings` in `renderer` (training's): the environment's held-out
    prompts and reward, or the `pairs`' prompts rewarded by similarity; the loss sequences of
    the `pairs` (the held-out split of `settings.data`, which the caller reads) when `data` is
    set. ConfigError naming the field if the environment cannot be loaded, `data` holds no
    pair or a pair does not render."""
    if settings.data is not None and not pairs:
        raise ConfigError("data", f"{settings.data} holds no held-out pair")
    if settings.env is not None:
        try:
            environment = load_environment(settings.env)
        except ValueError as error:
            raise ConfigError("env", str(error)) from None
        if not callable(getattr(environment, "prompts", None)):
            raise ConfigError(
                "env", f"{settings.env} is a multi-turn environment: evaluation needs prompts()"
            )
        seed = derive_seed(settings.seed, EVAL_CYCLE)
        prompts = held_out_prompts(environment, settings.prompts, seed)
        reward = environment.reward
    else:
        prompts = list({prompt_key(pair.prompt): pair.prompt for pair in pairs}.values())
        reward = ReferenceSimilarity(pairs).reward
    try:
        sequences = [
            renderer.build_supervised(list(pair.conversation)).last_turn()
            for pair in (pairs if settings.data is not None else ())
        ]
    except ValueError as error:
        raise ConfigError("data", str(error)) from None
    return EvalPlan(settings, renderer, prompts, reward, sequences)
