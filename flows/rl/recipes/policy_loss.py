"""The recipes of the policy losses (importance_sampling, ppo, cispo, gspo, dro, dppo): one
`rl_datum` per sampled sequence, the loss_config validated by the loss's settings model and
placed where the provider wants it (a clip range per token on tinker, as scalar keys elsewhere)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from flows.rl.recipes import (
    Advantages,
    LossSettings,
    Placement,
    Recipe,
    group_build_loss,
    policy_datums,
)
from whitney.payloads import forward_backward_payload

SettingsT = TypeVar("SettingsT", bound=LossSettings)
ExtraInputs = Callable[[list[int], Mapping[str, Any]], dict[str, Any]]
"""(prompt tokens, sampled sequence) -> further loss_inputs of the sequence's datum."""


def scalar_keys(settings: LossSettings, provider: str) -> Placement:
    """Every setting as a scalar loss_config key, whatever the provider."""
    return {}, settings.model_dump()


def policy_loss_recipe(
    loss_function: str,
    settings: type[SettingsT],
    place: Callable[[SettingsT, str], Placement],
    extra_inputs: ExtraInputs | None = None,
) -> Recipe:
    """The recipe of `loss_function`: its loss_config validated by `settings` and placed for
    the provider by `place`; each datum's loss_inputs with `extra_inputs` added."""

    def payload(
        prompt_tokens: list[int],
        sequences: list[dict[str, Any]],
        advantages: Advantages,
        loss_config: Mapping[str, float],
        provider: str,
    ) -> dict[str, Any]:
        datum_options, keys = place(settings.model_validate(dict(loss_config)), provider)
        data = policy_datums(prompt_tokens, sequences, advantages, **datum_options)
        built = forward_backward_payload(data, loss_function, keys)
        if extra_inputs is not None:
            for datum, sequence in zip(built["data"], sequences, strict=True):
                datum["loss_inputs"].update(extra_inputs(prompt_tokens, sequence))
        return built

    payload.__doc__ = f"{loss_function} datums, their loss_config placed for the provider."
    return Recipe(
        name=loss_function,
        loss_function=loss_function,
        build_loss=group_build_loss(payload),
        loss_settings=settings,
        payload=payload,
    )
