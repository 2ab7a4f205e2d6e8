"""The judge's questions and how its answers become rewards (no Prefect; docs/judge.md).

    logprobs   one `logprobs` call per completion: the question's tokens followed by each
               answer label's tokens; the reward is sum_i p_i * value_i, p the softmax over
               the labels of their summed token logprobs (P(Yes) / (P(Yes) + P(No)) with the
               default choices)
    verdict    one `sample` per completion (seeded from the question); the reward is the
               value of the label that appears first in the judge's answer
    group      one `sample` per group (RULER-style): the judge scores every numbered reply
               as `number: score`; the reward of reply k is its score / scale

A question is one user message rendered by the judge's renderer, whatever the policy's: the
judge reads the completion as text, so any model the provider serves can judge.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flows.core.loop.plans import derive_seed
from flows.rl.judge_config import JudgeSettings
from whitney.payloads import sample_request
from whitney.renderers import Prompt, Renderer, as_messages

GROUP_SCORE = re.compile(r"(\d+)\s*[:=.)-]\s*(\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Question:
    """One judge call: its kind (`logprobs` or `sample`) and payload, and how many tokens its
    question has (logprobs: where the answer labels start)."""

    kind: str
    payload: dict[str, Any]
    question_tokens: int

    def key(self, model: str) -> str:
        """The cache key: judge model, call kind and canonical payload (rubric, prompt and
        completion as the judge's tokens, seed) hashed."""
        text = json.dumps([model, self.kind, self.payload], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def prompt_text(prompt: Prompt) -> str:
    """The request as the judge reads it: a text prompt as is, messages as `role: content`
    lines (one user message: its content)."""
    messages = as_messages(prompt)
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n".join(f"{message['role']}: {message['content']}" for message in messages)


def question_seed(seed: int, tokens: Sequence[int]) -> int:
    """The judge's sampling seed of a question: from the config seed and its tokens, so the
    same question always gets the same answer."""
    digest = hashlib.sha256(json.dumps(list(tokens)).encode()).digest()
    return derive_seed(seed, int.from_bytes(digest[:4], "big"))


class Rubric:
    """The judge's questions for one setting, rendered by the judge's renderer."""

    def __init__(self, model: str, settings: JudgeSettings, renderer: Renderer, seed: int) -> None:
        self.model = model
        self.settings = settings
        self.renderer = renderer
        self.seed = seed
        self.labels = list(settings.choices)
        self.answers = [renderer.tokenizer.encode(label) for label in self.labels]

    def tokens(self, text: str) -> list[int]:
        return self.renderer.build_generation_prompt([{"role": "user", "content": text}])

    def item_text(self, prompt: Prompt, completion: str) -> str:
        """The question about one completion."""
        choices = " or ".join(self.labels)
        return self.settings.question.format(
            rubric=self.settings.rubric,
            prompt=prompt_text(prompt),
            completion=completion,
            choices=choices,
        )

    def group_text(self, prompt: Prompt, completions: Sequence[str]) -> str:
        """The question about a group: its replies numbered from 1."""
        numbered = "\n".join(
            f"Reply {index}: {text}" for index, text in enumerate(completions, start=1)
        )
        return self.settings.question.format(
            rubric=self.settings.rubric,
            prompt=prompt_text(prompt),
            completions=numbered,
            scale=self.settings.scale,
        )

    def sample_question(self, text: str) -> Question:
        tokens = self.tokens(text)
        payload = sample_request(
            tokens,
            1,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            stop_token_ids=list(self.renderer.stop_tokens),
            seed=question_seed(self.seed, tokens),
        )
        return Question("sample", payload, len(tokens))

    def item_question(self, prompt: Prompt, completion: str) -> Question:
        """The call that grades one completion (modes logprobs and verdict)."""
        text = self.item_text(prompt, completion)
        if self.settings.mode == "verdict":
            return self.sample_question(text)
        tokens = self.tokens(text)
        sequences = [{"token_ids": tokens + answer} for answer in self.answers]
        return Question("logprobs", {"sequences": sequences}, len(tokens))

    def group_question(self, prompt: Prompt, completions: Sequence[str]) -> Question:
        """The call that scores a whole group (mode group)."""
        return self.sample_question(self.group_text(prompt, completions))

    def item_reward(self, question: Question, result: dict[str, Any]) -> float:
        """A completion's reward from the judge's answer to its question."""
        if question.kind == "logprobs":
            rows = result["logprobs"]
            return choice_expectation(
                [sum(row[question.question_tokens :]) for row in rows],
                list(self.settings.choices.values()),
            )
        return self.verdict_reward(self.answer_text(result))

    def answer_text(self, result: dict[str, Any]) -> str:
        """The judge's sampled answer as text."""
        return self.renderer.parse_response(result["sequences"][0]["tokens"])["content"]

    def verdict_reward(self, answer: str) -> float:
        """The value of the label that appears first in `answer` (the longer one at a tie),
        else unparsed_reward."""
        found = [
            (index, -len(label), label)
            for label in self.labels
            if (index := answer.find(label)) >= 0
        ]
        if not found:
            return self.settings.unparsed_reward
        return self.settings.choices[min(found)[2]]

    def group_rewards(self, result: dict[str, Any], size: int) -> list[float]:
        """Each reply's score / scale from the judge's `number: score` lines (the first line
        for a number counts; a score above scale is scale), else unparsed_reward."""
        scores: dict[int, float] = {}
        for number, score in GROUP_SCORE.findall(self.answer_text(result)):
            scores.setdefault(int(number), min(float(score), self.settings.scale))
        return [
            scores[index] / self.settings.scale
            if index in scores
            else self.settings.unparsed_reward
            for index in range(1, size + 1)
        ]


def choice_expectation(logprobs: Sequence[float], values: Sequence[float]) -> float:
    """sum_i softmax(logprobs)_i * values_i: the expected reward under the judge's odds of
    each answer, renormalised over the answers."""
    top = max(logprobs)
    weights = [math.exp(logprob - top) for logprob in logprobs]
    return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)
