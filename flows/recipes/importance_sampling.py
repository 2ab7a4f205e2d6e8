"""The `importance_sampling` recipe: one `rl_datum` per sampled sequence, with the group's
advantage broadcast over its tokens, and the sampler's logprobs for the importance ratio."""

from __future__ import annotations

from typing import Any

from flows.context import LossContext
from flows.recipes import Recipe
from whitney.datums import rl_datum
from whitney.payloads import forward_backward_payload

LOSS_FUNCTION = "importance_sampling"


def build_loss(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """The page's build_loss for importance_sampling: no extra calls, no clip tensors."""
    prompt_tokens = request["prompt"]["token_ids"]
    data = [
        rl_datum(prompt_tokens, sequence["tokens"], sequence["logprobs"], advantage)
        for sequence, advantage in zip(sample["sequences"], ctx.advantages, strict=True)
    ]
    return forward_backward_payload(data, LOSS_FUNCTION, dict(ctx.loss_config))


RECIPE = Recipe(name="importance_sampling", loss_function=LOSS_FUNCTION, build_loss=build_loss)
