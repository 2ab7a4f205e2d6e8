"""The `cispo` recipe: REINFORCE weighted by the clipped, detached importance ratio
(losses.md bounds 0.0 / 4.0), placed per token on tinker, as loss_config keys elsewhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from flows.recipes import Advantages, ClipRange, Recipe, clipped_payload, group_build_loss

LOSS_FUNCTION = "cispo"


class CISPOSettings(ClipRange):
    """CISPO's ratio bounds (losses.md defaults)."""

    clip_low_threshold: float = Field(default=0.0, ge=0, description="Lower ratio bound")
    clip_high_threshold: float = Field(default=4.0, gt=0, description="Upper ratio bound")


def payload(
    prompt_tokens: list[int],
    sequences: list[dict[str, Any]],
    advantages: Advantages,
    loss_config: Mapping[str, float],
    provider: str,
) -> dict[str, Any]:
    """cispo datums with the clip range placed for the provider."""
    clip = CISPOSettings.model_validate(dict(loss_config))
    return clipped_payload(LOSS_FUNCTION, clip, prompt_tokens, sequences, advantages, provider)


RECIPE = Recipe(
    name="cispo",
    loss_function=LOSS_FUNCTION,
    build_loss=group_build_loss(payload),
    loss_settings=CISPOSettings,
    payload=payload,
)
