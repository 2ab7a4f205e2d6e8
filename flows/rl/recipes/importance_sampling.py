"""The `importance_sampling` recipe: one `rl_datum` per sampled sequence, with the group's
advantage broadcast over its tokens, and the sampler's logprobs for the importance ratio."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.rl.recipes import Advantages, LossSettings, Recipe, group_build_loss, policy_datums
from whitney.payloads import forward_backward_payload

LOSS_FUNCTION = "importance_sampling"


class ImportanceSamplingSettings(LossSettings):
    """importance_sampling takes no loss_config keys."""


def payload(
    prompt_tokens: list[int],
    sequences: list[dict[str, Any]],
    advantages: Advantages,
    loss_config: Mapping[str, float],
    provider: str,
) -> dict[str, Any]:
    """Loop building blocks' build_loss for importance_sampling: no extra calls, no clip tensors."""
    data = policy_datums(prompt_tokens, sequences, advantages)
    return forward_backward_payload(data, LOSS_FUNCTION, dict(loss_config))


build_loss = group_build_loss(payload)

RECIPE = Recipe(
    name="importance_sampling",
    loss_function=LOSS_FUNCTION,
    build_loss=build_loss,
    loss_settings=ImportanceSamplingSettings,
    payload=payload,
)
