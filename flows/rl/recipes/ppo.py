"""The `ppo` recipe: PPO's clipped importance ratio on the group-relative advantages (no
critic; see `ppo_critic` for PPO with one). The clip range goes per token on tinker, as
scalar loss_config keys elsewhere."""

from __future__ import annotations

from pydantic import Field

from flows.rl.recipes import ClipRange, clip_placement
from flows.rl.recipes.policy_loss import policy_loss_recipe

LOSS_FUNCTION = "ppo"


class PPOSettings(ClipRange):
    """PPO's ratio bounds (docs/losses.md defaults)."""

    clip_low_threshold: float = Field(default=0.8, ge=0, description="Lower ratio bound")
    clip_high_threshold: float = Field(default=1.2, gt=0, description="Upper ratio bound")


RECIPE = policy_loss_recipe(LOSS_FUNCTION, PPOSettings, clip_placement)
