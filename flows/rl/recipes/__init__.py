"""`build_loss` recipes by loss name: each turns one group's sample into a ForwardPayload.

A recipe is the `build_loss(sample, cycle, request, ctx) -> dict` of Whitney's Loop building
blocks, called once per group (one sample request per prompt) with a
`flows.rl.recipes.context.LossContext`; the cycle joins the groups' payloads into one
forward_backward. A recipe may make further ordered calls through `ctx.client`. Built-in
recipes register their module in `RECIPES`; one of your own loads by import path (`RLConfig.recipe`,
`module:attr`).

Beside `build_loss`, a recipe may declare:

- `loss_settings`: the pydantic model of its `loss_config` keys (Whitney's names, with the
  defaults of docs/losses.md). The recipe places them where the provider wants them: clip bounds as
  per-token tensors on tinker (`rl_datum(clip_low=, clip_high=)`), as scalar `loss_config`
  keys elsewhere. A key the model does not know is refused before anything is allocated.
- `payload`: the group's payload from per-sequence advantages (a scalar or one value per
  completion token), which wrappers such as `reference_kl` build on.
- `auxiliary_runs`: runs the flow creates beside the policy, in the same session and from
  the same base model (a critic, a frozen reference); `ctx.runs[name]` in every call.
- `finish_cycle(cycle, ctx)`: called once per cycle after every group's build_loss, e.g. to
  train the critic; returns metrics for the cycle's record.
- `options`: the RLConfig section (e.g. `critic`) bound into `build_loss` and
  `finish_cycle` as the keyword `options`.

A sequence of a multi-turn episode (`flows.rl.multi_turn_transcripts`) holds the whole transcript
after its prompt, and an `action_mask`: 1.0 on the tokens the policy sampled, 0.0 on the observation
tokens the environment wrote between turns. Every recipe trains only the action tokens
(`action_mask`, `mask_observations`): observation tokens get weight 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

from flows.core.fields import Settings
from flows.core.imports import import_registered
from flows.rl.recipes.context import LossContext
from whitney.datums import Datum, rl_datum, tensor
from whitney.payloads import forward_backward_payload

BuildLoss = Callable[[dict[str, Any], int, dict[str, Any], LossContext], dict[str, Any]]
Advantages = Sequence[float | Sequence[float]]
"""Per sequence of a group: one advantage for all its tokens, or one per completion token."""
PayloadBuilder = Callable[
    [list[int], list[dict[str, Any]], Advantages, Mapping[str, float], str], dict[str, Any]
]
"""`payload(prompt_tokens, sequences, advantages, loss_config, provider) -> ForwardPayload`."""
FinishCycle = Callable[[int, LossContext], dict[str, float]]
Placement = tuple[dict[str, float], dict[str, float]]
"""Where a loss's settings go: (rl_datum keyword arguments, the payload's loss_config keys)."""

CRITIC_PROVIDERS: frozenset[str] = frozenset({"modal", "local"})
"""Providers with `role: "critic"` runs (docs/api.md, Providers): Tinker has none."""

CLIP_TENSOR_PROVIDERS: frozenset[str] = frozenset({"tinker"})
"""Where recipes send clip bounds as per-token tensors (a Tinker mechanism); every other
provider gets them as scalar loss_config keys (`local` accepts either)."""


@dataclass(frozen=True)
class AuxiliaryRun:
    """A run a recipe needs beside the policy: same session, provider and base model."""

    name: str
    """Its key in `ctx.runs`, and its label."""
    role: str = "policy"
    """`critic` for a value head (modal and local only)."""
    trainable: bool = True
    """False for a frozen reference: it only answers sampler operations."""
    sampler: bool = False
    """Publish one sampler (named after the run) at creation, for `logprobs`."""


@dataclass(frozen=True)
class Recipe:
    """A build_loss callable and the loss function its payloads use."""

    name: str
    loss_function: str
    build_loss: BuildLoss
    loss_settings: type[BaseModel] | None = None
    """Validates `config.loss_config`; None: passed through as the payload's loss_config."""
    payload: PayloadBuilder | None = None
    auxiliary_runs: tuple[AuxiliaryRun, ...] = ()
    finish_cycle: FinishCycle | None = None
    options: str | None = None
    """The RLConfig field whose value is bound as `options=` (see the module docstring)."""

    def bind_options(self, options: Any) -> Recipe:
        """This recipe with `options` bound into build_loss and finish_cycle."""
        finish = self.finish_cycle
        return replace(
            self,
            build_loss=functools.partial(self.build_loss, options=options),
            finish_cycle=None if finish is None else functools.partial(finish, options=options),
            options=None,
        )


class LossSettings(Settings):
    """A recipe's loss_config keys: unknown keys refused, defaults from docs/losses.md."""


class ClipRange(LossSettings):
    """`clip_low_threshold` / `clip_high_threshold`: absolute ratio bounds, low < high."""

    clip_low_threshold: float
    clip_high_threshold: float

    @model_validator(mode="after")
    def _ordered(self) -> ClipRange:
        if not 0 <= self.clip_low_threshold < self.clip_high_threshold:
            raise ValueError(
                "need 0 <= clip_low_threshold < clip_high_threshold, got "
                f"{self.clip_low_threshold} and {self.clip_high_threshold}"
            )
        return self


RECIPES: dict[str, str] = {
    "cross_entropy": "flows.rl.recipes.cross_entropy:RECIPE",
    "importance_sampling": "flows.rl.recipes.importance_sampling:RECIPE",
    "ppo": "flows.rl.recipes.ppo:RECIPE",
    "cispo": "flows.rl.recipes.cispo:RECIPE",
    "dro": "flows.rl.recipes.dro:RECIPE",
    "gspo": "flows.rl.recipes.gspo:RECIPE",
    "dppo": "flows.rl.recipes.dppo:RECIPE",
    "ppo_critic": "flows.rl.recipes.ppo_critic:RECIPE",
}
"""Recipe import paths by loss name (`ppo_critic`: PPO with a critic run)."""


def load_recipe(name: str) -> Recipe:
    """The built-in recipe for loss `name`, or the recipe at import path `name` (`module:attr`);
    ValueError naming the available ones if there is none."""
    path, recipe = import_registered(RECIPES, name, f"no build_loss recipe for loss {name!r} yet")
    if not isinstance(recipe, Recipe):
        raise ValueError(f"{path} is not a Recipe")
    return recipe


def parse_loss_settings(recipe: Recipe, loss_config: Mapping[str, float]) -> BaseModel | None:
    """The recipe's validated loss settings; ValueError naming the key otherwise."""
    if recipe.loss_settings is None:
        return None
    try:
        return recipe.loss_settings.model_validate(dict(loss_config))
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        key = ".".join(str(part) for part in first["loc"])
        accepted = ", ".join(recipe.loss_settings.model_fields) or "none"
        where = f"loss_config.{key}" if key else "loss_config"
        raise ValueError(
            f"{where}: {first['msg']} (the {recipe.name} recipe accepts: {accepted})"
        ) from None


def clip_placement(clip: ClipRange, provider: str) -> Placement:
    """Where a clip range goes on `provider`.

    Per-token tensors on tinker, which refuses the scalar keys; scalar keys elsewhere (modal
    refuses the tensors)."""
    low, high = clip.clip_low_threshold, clip.clip_high_threshold
    if provider in CLIP_TENSOR_PROVIDERS:
        return {"clip_low": low, "clip_high": high}, {}
    return {}, {"clip_low_threshold": low, "clip_high_threshold": high}


def action_mask(sequence: Mapping[str, Any]) -> list[float]:
    """1.0 on each token of `sequence` the policy sampled, 0.0 on each observation token of a
    multi-turn transcript; all 1.0 for a sequence without an `action_mask`."""
    mask = sequence.get("action_mask")
    return [1.0] * len(sequence["tokens"]) if mask is None else [float(value) for value in mask]


def mask_observations(datum: Datum, prompt_length: int, mask: Sequence[float]) -> Datum:
    """`datum` (an rl_datum or sft_datum after a prompt of `prompt_length` tokens) with its
    weights and advantages multiplied by `mask` on the completion's positions: 0 wherever the
    target is an observation token."""
    loss_inputs: dict[str, Any] = datum["loss_inputs"]  # type: ignore[assignment]
    pad = prompt_length - 1
    for name in ("weights", "advantages"):
        if name in loss_inputs:
            values = list(loss_inputs[name]["values"])
            for index, keep in enumerate(mask):
                values[pad + index] *= keep
            loss_inputs[name] = tensor("float32", values)
    return datum


def policy_datums(
    prompt_tokens: list[int],
    sequences: Sequence[Mapping[str, Any]],
    advantages: Advantages,
    **datum_options: float,
) -> list[Datum]:
    """One `rl_datum` per sampled sequence, with its advantage(s) and `datum_options`
    (`clip_low` / `clip_high`); a transcript's observation tokens get weight 0."""
    data = []
    for sequence, advantage in zip(sequences, advantages, strict=True):
        datum = rl_datum(
            prompt_tokens,
            sequence["tokens"],
            sequence["logprobs"],
            advantage if isinstance(advantage, int | float) else list(advantage),
            **datum_options,
        )
        if "action_mask" in sequence:
            datum = mask_observations(datum, len(prompt_tokens), sequence["action_mask"])
        data.append(datum)
    return data


def clipped_payload(
    loss_function: str,
    clip: ClipRange,
    prompt_tokens: list[int],
    sequences: Sequence[Mapping[str, Any]],
    advantages: Advantages,
    provider: str,
) -> dict[str, Any]:
    """The payload of a clipped loss (ppo_critic's policy), its clip range placed for
    `provider`."""
    datum_options, loss_config = clip_placement(clip, provider)
    data = policy_datums(prompt_tokens, sequences, advantages, **datum_options)
    return forward_backward_payload(data, loss_function, loss_config)


def group_build_loss(payload: PayloadBuilder) -> BuildLoss:
    """Loop building blocks' build_loss from a payload builder: the group's own advantages, no extra
    calls."""

    def build_loss(
        sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
    ) -> dict[str, Any]:
        return payload(
            request["prompt"]["token_ids"],
            sample["sequences"],
            ctx.advantages,
            ctx.loss_config,
            ctx.provider,
        )

    build_loss.__doc__ = payload.__doc__
    return build_loss


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
