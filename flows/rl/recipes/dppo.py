"""The `dppo` recipe: importance sampling inside a binary total-variation trust region,
`delta_low` / `delta_high` as scalar loss_config keys (modal and local serve dppo)."""

from __future__ import annotations

from pydantic import Field

from flows.rl.recipes import LossSettings
from flows.rl.recipes.policy_loss import policy_loss_recipe, scalar_keys

LOSS_FUNCTION = "dppo"


class DPPOSettings(LossSettings):
    """DPPO's trust region on p - mu (docs/losses.md defaults)."""

    delta_low: float = Field(default=0.2, gt=0, le=1, description="Largest drop mu - p kept")
    delta_high: float = Field(default=0.2, gt=0, le=1, description="Largest rise p - mu kept")


RECIPE = policy_loss_recipe(LOSS_FUNCTION, DPPOSettings, scalar_keys)
