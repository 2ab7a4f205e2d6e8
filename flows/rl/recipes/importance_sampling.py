"""The `importance_sampling` recipe: one `rl_datum` per sampled sequence, with the group's
advantage broadcast over its tokens, and the sampler's logprobs for the importance ratio; no
loss_config keys, no clip tensors."""

from __future__ import annotations

from flows.rl.recipes import LossSettings
from flows.rl.recipes.policy_loss import policy_loss_recipe, scalar_keys

LOSS_FUNCTION = "importance_sampling"


class ImportanceSamplingSettings(LossSettings):
    """importance_sampling takes no loss_config keys."""


RECIPE = policy_loss_recipe(LOSS_FUNCTION, ImportanceSamplingSettings, scalar_keys)
build_loss = RECIPE.build_loss
