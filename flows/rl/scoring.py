"""Rewards and advantages of one group (one prompt, group_size sampled completions)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flows.core.environments import Completion, Environment
from whitney.advantages import group_mean_advantages, leave_one_out_baseline
from whitney.tokenizers import Tokenizer

ADVANTAGE_ESTIMATORS: dict[str, Callable[[list[float]], list[float]]] = {
    "grpo": functools.partial(group_mean_advantages, normalize_std=True),
    "grpo_no_std": group_mean_advantages,
    "rloo": leave_one_out_baseline,
}
"""The config's `advantages` choices, from the page's helpers."""


@dataclass(frozen=True)
class GroupScore:
    """A group's rewards and advantages, in the order of the sampled sequences."""

    rewards: list[float]
    advantages: list[float]

    @property
    def uniform(self) -> bool:
        """All rewards equal: the advantages are all zero, the group teaches nothing."""
        return max(self.rewards) == min(self.rewards)


def score_group(
    environment: Environment,
    tokenizer: Tokenizer,
    prompt: str,
    sample: dict[str, Any],
    estimator: str,
) -> GroupScore:
    """Decode each sequence, reward it, and turn the rewards into advantages."""
    rewards = [
        float(
            environment.reward(
                prompt,
                Completion(tokenizer.decode(sequence["tokens"]), sequence["stop_reason"] == "stop"),
            )
        )
        for sequence in sample["sequences"]
    ]
    return GroupScore(rewards, ADVANTAGE_ESTIMATORS[estimator](rewards))
