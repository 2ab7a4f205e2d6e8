"""Provider emulation: what `modal`, `tinker` and `local` accept, checked before anything runs.

The loss rules are `whitney.losses.validate_loss_config`, the very function the client uses,
so client and server refuse the same payloads with the same messages.
"""

from __future__ import annotations

from typing import Any, get_args

from whitney import losses
from whitney.errors import InvalidDatum, InvalidRequest, UnsupportedLoss
from whitney.local.limits import Limits
from whitney.wire import (
    RUN_OPERATION_KINDS,
    RUN_OPERATIONS,
    SAMPLER_OPERATION_KINDS,
    SAMPLER_OPERATIONS,
    Provider,
)

PROVIDERS: tuple[str, ...] = get_args(Provider)
CRITIC_PROVIDERS: frozenset[str] = frozenset({"modal", "local"})
FROZEN_RUN_KINDS: frozenset[str] = frozenset({"save_weights_for_sampler"}) | SAMPLER_OPERATION_KINDS
CRITIC_LOSSES: frozenset[str] = frozenset({"ppo_critic", "ppo"})
CRITIC_INPUTS: tuple[str, ...] = ("values", "returns")


def capabilities(
    base_models: list[str], max_lora_rank: int, limits: Limits, session_ttl_s: float
) -> dict[str, Any]:
    """The capabilities document: never a loss list (Whitney forwards loss_function as is);
    the server's request limits, so that a client can plan its batches, and the session
    lease (0: sessions never expire)."""
    provider = {
        "base_models": list(base_models),
        "max_lora_rank": max_lora_rank,
        "run_operations": list(RUN_OPERATIONS),
        "sampler_operations": list(SAMPLER_OPERATIONS),
    }
    return {
        "api_version": "1",
        "providers": {name: dict(provider) for name in PROVIDERS},
        "limits": limits.document(),
        "session_ttl_s": session_ttl_s,
    }


def check_run_role(provider: str, role: str) -> None:
    if role == "critic" and provider not in CRITIC_PROVIDERS:
        raise InvalidRequest(
            f"role: critic runs exist on modal and local only, not on {provider}",
            details={"field": "role", "provider": provider},
        )


def check_route(kind: str, sampler_route: bool, run_id: str) -> None:
    """A run operation on the run route, a sampler operation on the sampler route."""
    if kind not in RUN_OPERATION_KINDS and kind not in SAMPLER_OPERATION_KINDS:
        known = ", ".join(RUN_OPERATIONS + SAMPLER_OPERATIONS)
        raise InvalidRequest(
            f"kind: unknown operation kind {kind!r} (known: {known})", details={"field": "kind"}
        )
    if sampler_route and kind in RUN_OPERATION_KINDS:
        raise InvalidRequest(
            f"kind: {kind!r} is a run operation: POST it to /v1/training/runs/{run_id}/operations",
            details={"field": "kind"},
        )
    if not sampler_route and kind in SAMPLER_OPERATION_KINDS:
        raise InvalidRequest(
            f"kind: {kind!r} is a sampler operation: POST it to "
            f"/v1/training/runs/{run_id}/samplers/{{sampler_id}}/operations",
            details={"field": "kind"},
        )


def check_operation(run: dict[str, Any], kind: str, payload: dict[str, Any]) -> None:
    """The provider's and the run's refusals of a validated payload (422 / 400)."""
    run_id, provider, role = run["run_id"], run["provider"], run["role"]
    if not run["trainable"] and kind not in FROZEN_RUN_KINDS:
        raise InvalidRequest(
            f"kind: run {run_id} is not trainable (trainable: false); it accepts only "
            "save_weights_for_sampler, sample and logprobs",
            details={"field": "kind", "kind": kind},
        )
    if role == "critic" and kind in FROZEN_RUN_KINDS:
        raise InvalidRequest(
            f"kind: run {run_id} is a critic run (a value head): it has no sampler, so "
            f"{kind} is refused",
            details={"field": "kind", "kind": kind},
        )
    if kind not in ("forward", "forward_backward"):
        return
    loss = payload["loss_function"]
    config = payload.get("loss_config") or {}
    data = payload["data"]
    served = losses.PROVIDER_LOSS_SUPPORT.get(provider, frozenset())
    if role != "critic" and loss == "ppo_critic" and loss in served:
        raise UnsupportedLoss(
            f"loss_function='ppo_critic' needs a critic run (role: critic); run {run_id} "
            "is a policy run",
            details={"loss_function": loss, "provider": provider},
        )
    losses.validate_loss_config(provider, loss, config, [] if role == "critic" else data)
    if role == "critic":
        if loss not in CRITIC_LOSSES:
            raise UnsupportedLoss(
                f"loss_function={loss!r} is not served on critic runs (a critic run trains "
                "its value head with ppo_critic, or ppo routed to it)",
                details={"loss_function": loss, "provider": provider},
            )
        for index, datum in enumerate(data):
            for name in CRITIC_INPUTS:
                if name not in datum["loss_inputs"]:
                    raise InvalidDatum(
                        f"data[{index}].loss_inputs.{name} is required by the critic loss",
                        details={"datum": index, "tensor": name},
                    )
