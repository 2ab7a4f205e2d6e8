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

from flows.rl.recipes import ClipRange, clip_placement
from flows.rl.recipes.policy_loss import policy_loss_recipe
from whitney.datums import tensor

LOSS_FUNCTION = "gspo"


class GSPOSettings(ClipRange):
    """GSPO's bounds on the sequence ratio (docs/losses.md defaults)."""

    clip_low_threshold: float = Field(default=0.8, ge=0, description="Lower ratio bound")
    clip_high_threshold: float = Field(default=1.2, gt=0, description="Upper ratio bound")


def sequence_ratio_mask(prompt_tokens: list[int], completion_length: int) -> dict[str, Any]:
    """1.0 on the right-shifted positions of the completion tokens, 0.0 on the prompt's."""
    pad = len(prompt_tokens) - 1
    return tensor("float32", [0.0] * pad + [1.0] * completion_length)


def mask_input(prompt_tokens: list[int], sequence: Mapping[str, Any]) -> dict[str, Any]:
    """The sequence's datum's `sequence_ratio_mask` loss input."""
    return {"sequence_ratio_mask": sequence_ratio_mask(prompt_tokens, len(sequence["tokens"]))}


RECIPE = policy_loss_recipe(LOSS_FUNCTION, GSPOSettings, clip_placement, mask_input)
