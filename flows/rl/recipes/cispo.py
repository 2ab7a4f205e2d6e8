"""The `cispo` recipe: REINFORCE weighted by the clipped, detached importance ratio
(docs/losses.md bounds 0.0 / 4.0), placed per token on tinker, as loss_config keys elsewhere."""

from __future__ import annotations

from pydantic import Field

from flows.rl.recipes import ClipRange, clip_placement
from flows.rl.recipes.policy_loss import policy_loss_recipe

LOSS_FUNCTION = "cispo"


class CISPOSettings(ClipRange):
    """CISPO's ratio bounds (docs/losses.md defaults)."""

    clip_low_threshold: float = Field(default=0.0, ge=0, description="Lower ratio bound")
    clip_high_threshold: float = Field(default=4.0, gt=0, description="Upper ratio bound")


RECIPE = policy_loss_recipe(LOSS_FUNCTION, CISPOSettings, clip_placement)
