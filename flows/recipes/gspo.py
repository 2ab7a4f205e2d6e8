"""The `gspo` recipe: GSPO-token, whose importance ratio is the sequence's (the geometric
mean of its token ratios) clipped as in PPO.

Each datum carries an explicit `sequence_ratio_mask` over its completion tokens, so the
sequence ratio is taken over exactly the sampled completion (GSPO's 1/|y| normalisation)
whatever a datum's `weights` say. The clip range goes as scalar loss_config keys (modal and
local serve gspo; tinker does not)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from flows.recipes import Advantages, ClipRange, Recipe, clipped_payload, group_build_loss
from whitney.datums import tensor

LOSS_FUNCTION = "gspo"


class GSPOSettings(ClipRange):
    """GSPO's bounds on the sequence ratio (losses.md defaults)."""

    clip_low_threshold: float = Field(default=0.8, ge=0, description="Lower ratio bound")
    clip_high_threshold: float = Field(default=1.2, gt=0, description="Upper ratio bound")


def sequence_ratio_mask(prompt_tokens: list[int], completion_length: int) -> dict[str, Any]:
    """1.0 on the right-shifted positions of the completion tokens, 0.0 on the prompt's."""
    pad = len(prompt_tokens) - 1
    return tensor("float32", [0.0] * pad + [1.0] * completion_length)


def payload(
    prompt_tokens: list[int],
    sequences: list[dict[str, Any]],
    advantages: Advantages,
    loss_config: Mapping[str, float],
    provider: str,
) -> dict[str, Any]:
    """gspo datums with their sequence ratio mask; the clip range placed for the provider."""
    clip = GSPOSettings.model_validate(dict(loss_config))
    built = clipped_payload(LOSS_FUNCTION, clip, prompt_tokens, sequences, advantages, provider)
    for datum, sequence in zip(built["data"], sequences, strict=True):
        mask = sequence_ratio_mask(prompt_tokens, len(sequence["tokens"]))
        datum["loss_inputs"]["sequence_ratio_mask"] = mask
    return built


RECIPE = Recipe(
    name="gspo",
    loss_function=LOSS_FUNCTION,
    build_loss=group_build_loss(payload),
    loss_settings=GSPOSettings,
    payload=payload,
)
