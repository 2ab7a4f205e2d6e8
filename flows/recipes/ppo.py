"""The `ppo` recipe: PPO's clipped importance ratio on the group-relative advantages (no
critic; see `ppo_critic` for PPO with one). The clip range goes per token on tinker, as
scalar loss_config keys elsewhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from flows.recipes import Advantages, ClipRange, Recipe, clipped_payload, group_build_loss

LOSS_FUNCTION = "ppo"


class PPOSettings(ClipRange):
    """PPO's ratio bounds (losses.md defaults)."""

    clip_low_threshold: float = Field(default=0.8, ge=0, description="Lower ratio bound")
    clip_high_threshold: float = Field(default=1.2, gt=0, description="Upper ratio bound")


def payload(
    prompt_tokens: list[int],
    sequences: list[dict[str, Any]],
    advantages: Advantages,
    loss_config: Mapping[str, float],
    provider: str,
) -> dict[str, Any]:
    """ppo datums with the clip range placed for the provider."""
    clip = PPOSettings.model_validate(dict(loss_config))
    return clipped_payload(LOSS_FUNCTION, clip, prompt_tokens, sequences, advantages, provider)


RECIPE = Recipe(
    name="ppo",
    loss_function=LOSS_FUNCTION,
    build_loss=group_build_loss(payload),
    loss_settings=PPOSettings,
    payload=payload,
)
