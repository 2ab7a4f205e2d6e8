"""A loss recipe of your own: importance_sampling with each completion's advantage its reward
minus its group's mean reward (no division by the group's spread).

Copy this file into your project and name its recipe in your RL config beside the loss it
trains, `loss = "importance_sampling"` and `recipe = "centered:RECIPE"`, as
examples/byo/centered.toml does; from the repository root:
`PYTHONPATH=examples/byo whitney-flows run rl --config examples/byo/centered.toml`.
"""

from __future__ import annotations

from typing import Any

from flows.rl.recipes import Recipe, policy_datums
from flows.rl.recipes.context import LossContext
from whitney.payloads import forward_backward_payload


def centered(rewards: list[float]) -> list[float]:
    """Each reward minus the group's mean."""
    mean = sum(rewards) / len(rewards)
    return [reward - mean for reward in rewards]


def build_loss(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """One group's forward_backward payload: an rl_datum per sampled sequence, its advantage
    broadcast over its tokens, the sampler's logprobs for the importance ratio."""
    data = policy_datums(request["prompt"]["token_ids"], sample["sequences"], centered(ctx.rewards))
    return forward_backward_payload(data, "importance_sampling", {})


RECIPE = Recipe(name="centered", loss_function="importance_sampling", build_loss=build_loss)
