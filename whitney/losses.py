"""The provider loss tables of Whitney's Loop building blocks as data, and the checks that fail
closed before allocation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from whitney.errors import InvalidDatum, InvalidLossConfig, UnsupportedLoss

LOSS_FUNCTIONS: tuple[str, ...] = (
    "cross_entropy",
    "importance_sampling",
    "ppo",
    "cispo",
    "dro",
    "gspo",
    "ppo_critic",
    "dppo",
)

PROVIDER_LOSS_SUPPORT: dict[str, frozenset[str]] = {
    "modal": frozenset(
        {"cross_entropy", "importance_sampling", "ppo", "cispo", "gspo", "ppo_critic", "dppo"}
    ),
    "tinker": frozenset({"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}),
    "local": frozenset(LOSS_FUNCTIONS),
}
"""The "Provider loss support" table, plus `local`: the embedded server serves all."""

MODAL_LOSS_CONFIG_KEYS: dict[str, frozenset[str]] = {
    "cross_entropy": frozenset(),
    "importance_sampling": frozenset(),
    "ppo": frozenset({"clip_low_threshold", "clip_high_threshold", "value_clip"}),
    "gspo": frozenset({"clip_low_threshold", "clip_high_threshold"}),
    "cispo": frozenset({"clip_low_threshold", "clip_high_threshold"}),
    "ppo_critic": frozenset({"value_clip"}),
    "dppo": frozenset({"delta_low", "delta_high"}),
}
"""The "Scalar loss_config keys Modal actually validates, per loss" table."""

TINKER_LOSS_CONFIG_KEYS: dict[str, frozenset[str]] = {
    "cross_entropy": frozenset(),
    "importance_sampling": frozenset(),
    "ppo": frozenset(),
    "cispo": frozenset(),
    "dro": frozenset({"beta"}),
}

PER_TOKEN_CLIP_TENSORS: tuple[str, ...] = ("clip_low_threshold", "clip_high_threshold")
CLIP_CONFIG_KEYS: frozenset[str] = frozenset({"clip_low_threshold", "clip_high_threshold"})

LOSS_CONFIG_KEYS: dict[str, dict[str, frozenset[str]]] = {
    "modal": MODAL_LOSS_CONFIG_KEYS,
    "tinker": TINKER_LOSS_CONFIG_KEYS,
    "local": {
        loss: MODAL_LOSS_CONFIG_KEYS.get(loss, frozenset())
        | TINKER_LOSS_CONFIG_KEYS.get(loss, frozenset())
        for loss in LOSS_FUNCTIONS
    },
}

REQUIRED_LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
    "gspo": ("target_tokens", "logprobs", "advantages"),
    "dppo": ("target_tokens", "logprobs", "advantages"),
    "ppo_critic": ("values", "returns"),
}

PER_TOKEN_CLIP_PROVIDERS: frozenset[str] = frozenset({"tinker", "local"})


def _provider_losses(provider: str, support: dict[str, frozenset[str]]) -> frozenset[str]:
    """The losses `support` lists for `provider`; ValueError for a provider it does not name."""
    supported = support.get(provider)
    if supported is None:
        raise ValueError(f"Unknown provider {provider!r}")
    return supported


def require_advertised_loss(
    provider: str, loss_function: str, support: dict[str, frozenset[str]]
) -> None:
    """Fail closed before allocation when a loss name isn't one Whitney forwards for this provider."""  # noqa: E501
    supported = _provider_losses(provider, support)
    if loss_function not in supported:
        raise ValueError(
            f"{provider} does not advertise loss_function={loss_function!r} "
            f"(known losses: {', '.join(sorted(supported))})"
        )


def validate_loss_config(
    provider: str,
    loss_function: str,
    loss_config: Mapping[str, float] | None,
    data: Sequence[Mapping[str, Any]],
) -> None:
    """Refuse, before anything is sent, what the provider would refuse with a 422.

    Raises UnsupportedLoss, InvalidLossConfig or InvalidDatum with the provider's message.
    """
    supported = _provider_losses(provider, PROVIDER_LOSS_SUPPORT)
    if loss_function not in supported:
        raise UnsupportedLoss(
            f"{provider} does not serve loss_function={loss_function!r} "
            f"(served: {', '.join(sorted(supported))})",
            status=422,
            details={"loss_function": loss_function, "provider": provider},
        )
    allowed = LOSS_CONFIG_KEYS[provider].get(loss_function, frozenset())
    for key in sorted(loss_config or {}):
        if key in allowed:
            continue
        if provider == "tinker" and key in CLIP_CONFIG_KEYS:
            message = (
                f"loss_config.{key} is not accepted by tinker: set the clip range per token "
                f"with the clip_low_threshold / clip_high_threshold loss_inputs tensors"
            )
        else:
            accepted = ", ".join(sorted(allowed)) or "none"
            message = (
                f"loss_config.{key} is not accepted by {provider} for "
                f"loss_function={loss_function!r} (accepted keys: {accepted})"
            )
        raise InvalidLossConfig(message, status=422, details={"key": key})
    for index, datum in enumerate(data):
        loss_inputs = datum.get("loss_inputs", {})
        if provider not in PER_TOKEN_CLIP_PROVIDERS:
            for name in PER_TOKEN_CLIP_TENSORS:
                if name in loss_inputs:
                    raise _invalid_tensor(
                        index,
                        name,
                        ": per-token clip tensors are a Tinker-only mechanism; "
                        f"on {provider} use the scalar loss_config key",
                    )
        for name in REQUIRED_LOSS_INPUTS[loss_function]:
            if name not in loss_inputs:
                raise _invalid_tensor(
                    index, name, f" is required by loss_function={loss_function!r}"
                )


def _invalid_tensor(index: int, name: str, problem: str) -> InvalidDatum:
    """The 422 about loss_inputs tensor `name` of datum `index`: its place, then `problem`."""
    return InvalidDatum(
        f"data[{index}].loss_inputs.{name}{problem}",
        status=422,
        details={"datum": index, "tensor": name},
    )
