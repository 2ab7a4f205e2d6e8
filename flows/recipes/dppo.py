"""The `dppo` recipe: importance sampling inside a binary total-variation trust region,
`delta_low` / `delta_high` as scalar loss_config keys (modal and local serve dppo)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from flows.recipes import Advantages, LossSettings, Recipe, group_build_loss, policy_datums
from whitney.payloads import forward_backward_payload

LOSS_FUNCTION = "dppo"


class DPPOSettings(LossSettings):
    """DPPO's trust region on p - mu (losses.md defaults)."""

    delta_low: float = Field(default=0.2, gt=0, le=1, description="Largest drop mu - p kept")
    delta_high: float = Field(default=0.2, gt=0, le=1, description="Largest rise p - mu kept")


def payload(
    prompt_tokens: list[int],
    sequences: list[dict[str, Any]],
    advantages: Advantages,
    loss_config: Mapping[str, float],
    provider: str,
) -> dict[str, Any]:
    """dppo datums; the trust region as scalar loss_config keys."""
    settings = DPPOSettings.model_validate(dict(loss_config))
    data = policy_datums(prompt_tokens, sequences, advantages)
    return forward_backward_payload(data, LOSS_FUNCTION, settings.model_dump())


RECIPE = Recipe(
    name="dppo",
    loss_function=LOSS_FUNCTION,
    build_loss=group_build_loss(payload),
    loss_settings=DPPOSettings,
    payload=payload,
)
