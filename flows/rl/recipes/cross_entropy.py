"""The `cross_entropy` recipe for RL: rejection-sampling fine-tuning (expert iteration).

Each group's sequences whose advantage is positive (better than the group's baseline) become
`sft_datum`s, supervised like SFT data; the others are sent with all weights 0, so they add
nothing and a group with no better-than-baseline sequence still yields a valid payload. A
multi-turn transcript is supervised on its actions only. No importance ratio, no loss_config
keys: served by every provider."""

from __future__ import annotations

from typing import Any

from flows.rl.recipes import LossSettings, Recipe, action_mask, mask_observations
from flows.rl.recipes.context import LossContext
from whitney.datums import Datum, sft_datum, tensor
from whitney.payloads import forward_backward_payload

LOSS_FUNCTION = "cross_entropy"


class CrossEntropySettings(LossSettings):
    """cross_entropy takes no loss_config keys."""


def selected_datum(prompt_tokens: list[int], sequence: dict[str, Any], selected: bool) -> Datum:
    """The sequence's sft_datum (its observation tokens weight 0); with all weights 0 unless
    `selected`."""
    datum = sft_datum(prompt_tokens, sequence["tokens"])
    if "action_mask" in sequence:
        datum = mask_observations(datum, len(prompt_tokens), action_mask(sequence))
    if not selected:
        weights = datum["loss_inputs"]["weights"]["values"]  # type: ignore[index]
        datum["loss_inputs"]["weights"] = tensor("float32", [0.0] * len(weights))  # type: ignore[index]
    return datum


def build_loss(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """cross_entropy on the group's better-than-baseline sequences."""
    prompt_tokens = request["prompt"]["token_ids"]
    data = [
        selected_datum(prompt_tokens, sequence, advantage > 0)
        for sequence, advantage in zip(sample["sequences"], ctx.advantages, strict=True)
    ]
    return forward_backward_payload(data, LOSS_FUNCTION, dict(ctx.loss_config))


RECIPE = Recipe(
    name="cross_entropy",
    loss_function=LOSS_FUNCTION,
    build_loss=build_loss,
    loss_settings=CrossEntropySettings,
)
