"""Plug-ins the flow tests load by import path (`flowtest_plugins:...`)."""

from __future__ import annotations

from typing import Any

from flows.core.environments import Completion
from flows.core.environments.digits import DigitsEnvironment
from flows.rl.recipes import Recipe
from flows.rl.recipes.context import LossContext
from flows.rl.recipes.importance_sampling import build_loss as importance_sampling


class CycleAwareDigits(DigitsEnvironment):
    """The digits environment, keeping the cycle of its latest prompts in `cycle` (a cycle
    asks for its prompts before it rewards their completions)."""

    def __init__(self) -> None:
        self.cycle = 0

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        self.cycle = cycle
        return super().prompts(cycle, count, seed)


class BrokenAtCycle1(CycleAwareDigits):
    """The digits environment, except that rewarding anything in cycle 1 always fails."""

    def reward(self, prompt: str, completion: Completion) -> float:
        if self.cycle == 1:
            raise RuntimeError("injected: the reward of cycle 1 is broken")
        return super().reward(prompt, completion)


def build_loss_with_logprobs(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """importance_sampling, after an extra ordered `logprobs` call through ctx.client."""
    prompt = request["prompt"]["token_ids"]
    sequences = [{"token_ids": prompt + sequence["tokens"]} for sequence in sample["sequences"]]
    result = ctx.client.sampler_operation(
        ctx.run_id, ctx.sampler_id, "logprobs", {"sequences": sequences}
    )
    assert len(result["logprobs"]) == len(sequences)
    return importance_sampling(sample, cycle, request, ctx)


WITH_LOGPROBS = Recipe(
    name="importance_sampling",
    loss_function="importance_sampling",
    build_loss=build_loss_with_logprobs,
)
