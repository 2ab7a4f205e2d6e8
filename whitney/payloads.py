"""Operation payloads: `forward_backward_payload` of Whitney's Loop building blocks, and the
helpers its skeleton uses without showing them (`adamw_optimizer`, `result_sampler_id`,
`sample_request`).

Each helper returns the plain JSON-ready dict of docs/api.md, validated with the matching
`whitney.wire` model, so a malformed payload fails here, before anything is sent. Validation
failures are ValueErrors (pydantic's ValidationError is one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from whitney import wire
from whitney.datums import Datum

__all__ = [
    "adamw_optimizer",
    "forward_backward_payload",
    "result_sampler_id",
    "sample_request",
]

_ADAMW_OVERRIDES: tuple[str, ...] = ("beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
_SAMPLING_PARAMS: tuple[str, ...] = tuple(wire.SamplingParams.model_fields)


def forward_backward_payload(
    data: list[Datum],
    loss_function: str,
    loss_config: dict[str, float] | None = None,
) -> dict:
    """Assemble a Whitney ForwardPayload: {data, loss_function, loss_config}."""
    if not data:
        raise ValueError("forward_backward_payload needs at least one datum")
    return {"data": data, "loss_function": loss_function, "loss_config": dict(loss_config or {})}


def adamw_optimizer(learning_rate: float, **overrides: float) -> dict:
    """The Optimizer dict of docs/api.md: `adamw` with its defaults (beta1 0.9, beta2 0.95,
    eps 1e-8, weight_decay 0.0, grad_clip_norm 0.0 = off), `overrides` replacing any of them.

    An unknown override, or a value the wire model refuses, raises ValueError.
    """
    for key in overrides:
        if key not in _ADAMW_OVERRIDES:
            raise ValueError(
                f"adamw_optimizer got an unknown override {key!r} "
                f"(known: {', '.join(_ADAMW_OVERRIDES)})"
            )
    optimizer = wire.Optimizer.model_validate(
        {"type": "adamw", "learning_rate": learning_rate, **overrides}
    )
    return optimizer.model_dump()


def result_sampler_id(result: Mapping[str, Any] | wire.SamplerResult | wire.Operation) -> str:
    """The `sampler_id` of a `save_weights_for_sampler` result.

    Takes the result dict (what `run_operation` returns), a `wire.SamplerResult`, or the
    terminal `wire.Operation` (what `execute` returns). ValueError when there is none.
    """
    if isinstance(result, wire.Operation):
        if result.kind != "save_weights_for_sampler":
            raise ValueError(
                f"result_sampler_id needs a save_weights_for_sampler result, "
                f"got a {result.kind!r} operation"
            )
        result = result.result or {}
    if isinstance(result, wire.SamplerResult):
        return result.sampler_id
    if not isinstance(result, Mapping):
        raise ValueError(
            f"result_sampler_id needs a save_weights_for_sampler result dict, "
            f"got {type(result).__name__}"
        )
    sampler_id = result.get("sampler_id")
    if not isinstance(sampler_id, str) or not sampler_id:
        raise ValueError(
            "save_weights_for_sampler result has no sampler_id "
            f"(keys: {', '.join(sorted(map(str, result))) or 'none'})"
        )
    return sampler_id


def sample_request(prompt_tokens: Sequence[int], num_samples: int, **sampling_params: Any) -> dict:
    """A SampleRequest dict with every sampling parameter filled in.

    `max_tokens` is required; `temperature` (1.0), `top_p` (1.0), `top_k` (None = off),
    `stop_token_ids` ([]) and `seed` (None) default as in docs/api.md. An unknown
    parameter, a missing `max_tokens` or a value the wire model refuses raises ValueError.
    """
    for key in sampling_params:
        if key not in _SAMPLING_PARAMS:
            raise ValueError(
                f"sample_request got an unknown sampling parameter {key!r} "
                f"(known: {', '.join(_SAMPLING_PARAMS)})"
            )
    if "max_tokens" not in sampling_params:
        raise ValueError("sample_request needs sampling parameter max_tokens")
    request = wire.SampleRequest.model_validate(
        {
            "prompt": {"token_ids": list(prompt_tokens)},
            "num_samples": num_samples,
            "sampling_params": sampling_params,
        }
    )
    return request.model_dump()
