"""`build_loss` recipes by loss name: each turns one group's sample into a ForwardPayload.

A recipe is the page's `build_loss(sample, cycle, request, ctx) -> dict`, called once per
group (one sample request per prompt) with a `flows.context.LossContext`; the cycle joins the
groups' payloads into one forward_backward. A recipe may make further ordered calls through
`ctx.client`. New recipes register their module here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flows.context import LossContext
from flows.imports import import_object

BuildLoss = Callable[[dict[str, Any], int, dict[str, Any], LossContext], dict[str, Any]]


@dataclass(frozen=True)
class Recipe:
    """A build_loss callable and the loss function its payloads use."""

    name: str
    loss_function: str
    build_loss: BuildLoss


RECIPES: dict[str, str] = {
    "importance_sampling": "flows.recipes.importance_sampling:RECIPE",
}
"""Recipe import paths by loss name."""


def load_recipe(name: str) -> Recipe:
    """The recipe for loss `name`; ValueError naming the available ones if there is none."""
    path = RECIPES.get(name)
    if path is None:
        raise ValueError(
            f"no build_loss recipe for loss {name!r} yet (available: {', '.join(RECIPES)})"
        )
    recipe = import_object(path)
    if not isinstance(recipe, Recipe):
        raise ValueError(f"{path} is not a Recipe")
    return recipe


def join_payloads(payloads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ForwardPayload holding every group's data; the groups must agree on the loss."""
    if not payloads:
        raise ValueError("join_payloads needs at least one payload")
    first = payloads[0]
    for index, payload in enumerate(payloads[1:], start=1):
        if (payload["loss_function"], payload["loss_config"]) != (
            first["loss_function"],
            first["loss_config"],
        ):
            raise ValueError(f"payload {index} uses another loss_function or loss_config")
    return {
        "data": [datum for payload in payloads for datum in payload["data"]],
        "loss_function": first["loss_function"],
        "loss_config": first["loss_config"],
    }
