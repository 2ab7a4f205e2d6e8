"""The `dro` recipe: the advantage-weighted log-likelihood with a quadratic penalty
`0.5 * beta * (lp - q)^2` keeping the learner near the sampler. `beta` is a scalar
loss_config key (tinker and local serve dro; modal does not)."""

from __future__ import annotations

from pydantic import Field

from flows.rl.recipes import LossSettings
from flows.rl.recipes.policy_loss import policy_loss_recipe, scalar_keys

LOSS_FUNCTION = "dro"


class DROSettings(LossSettings):
    """DRO's penalty weight (docs/losses.md default)."""

    beta: float = Field(default=0.05, ge=0, description="Weight of the (lp - q)^2 penalty")


RECIPE = policy_loss_recipe(LOSS_FUNCTION, DROSettings, scalar_keys)
