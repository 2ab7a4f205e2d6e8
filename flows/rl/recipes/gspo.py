"""The `gspo` recipe: GSPO-token, whose importance ratio is the sequence's (the geometric
mean of its token ratios) clipped as in PPO.

Each datum carries an explicit `sequence_ratio_mask` over its sampled tokens (a multi-turn
transcript's actions, not its observations), so the sequence ratio is taken over exactly
what the policy sampled (GSPO's 1/|y| normalisation) whatever a datum's `weights` say. The
clip range goes as scalar loss_config keys (modal and local serve gspo; tinker does not)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from flows.rl.recipes import ClipRange, action_mask, clip_placement
from flows.rl.recipes.policy_loss import policy_loss_recipe
from whitney.datums import tensor

LOSS_FUNCTION = "gspo"


class GSPOSettings(ClipRange):
    """GSPO's bounds on the sequence ratio (docs/losses.md defaults)."""

    clip_low_threshold: float = Field(default=0.8, ge=0, description="Lower ratio bound")
    clip_high_threshold: float = Field(default=1.2, gt=0, description="Upper ratio bound")


def sequence_ratio_mask(prompt_tokens: list[int], mask: list[float]) -> dict[str, Any]:
    """`mask` (1.0 on the sampled tokens) on the right-shifted positions of the completion,
    0.0 on the prompt's."""
    pad = len(prompt_tokens) - 1
    return tensor("float32", [0.0] * pad + mask)


def mask_input(prompt_tokens: list[int], sequence: Mapping[str, Any]) -> dict[str, Any]:
    """The sequence's datum's `sequence_ratio_mask` loss input."""
    return {"sequence_ratio_mask": sequence_ratio_mask(prompt_tokens, action_mask(sequence))}


RECIPE = policy_loss_recipe(LOSS_FUNCTION, GSPOSettings, clip_placement, mask_input)
