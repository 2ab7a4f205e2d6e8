"""The `dro` recipe: the advantage-weighted log-likelihood with a quadratic penalty
`0.5 * beta * (lp - q)^2` keeping the learner near the sampler. `beta` is a scalar
loss_config key (tinker and local serve dro; modal does not)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from flows.recipes import Advantages, LossSettings, Recipe, group_build_loss, policy_datums
from whitney.payloads import forward_backward_payload

LOSS_FUNCTION = "dro"


class DROSettings(LossSettings):
    """DRO's penalty weight (losses.md default)."""

    beta: float = Field(default=0.05, ge=0, description="Weight of the (lp - q)^2 penalty")


def payload(
    prompt_tokens: list[int],
    sequences: list[dict[str, Any]],
    advantages: Advantages,
    loss_config: Mapping[str, float],
    provider: str,
) -> dict[str, Any]:
    """dro datums; beta as a scalar loss_config key."""
    settings = DROSettings.model_validate(dict(loss_config))
    data = policy_datums(prompt_tokens, sequences, advantages)
    return forward_backward_payload(data, LOSS_FUNCTION, {"beta": settings.beta})


RECIPE = Recipe(
    name="dro",
    loss_function=LOSS_FUNCTION,
    build_loss=group_build_loss(payload),
    loss_settings=DROSettings,
    payload=payload,
)
