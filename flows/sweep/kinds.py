"""The training flows a sweep can run, one kind per flow of the catalogue (flows.catalogue):
its config class, its deployment, and how a rung sets its length. No Prefect."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flows.catalogue import TRAINING_FLOWS, by_command
from flows.core.config import FlowConfig


@dataclass(frozen=True)
class TrialKind:
    """A training flow as a sweep's trial."""

    config: type[FlowConfig]
    deployment: str
    """flow/deployment, as prefect.deployments.run_deployment names it."""
    sizing: tuple[str, ...]
    """The fields the sweep sets from its rungs (a sweep refuses them in base or the search)."""
    sized: Callable[[Mapping[str, Any], int], dict[str, Any]]
    """The settings that make a trial of `settings` train cycles 0..n-1."""


def cycles_sized(settings: Mapping[str, Any], cycles: int) -> dict[str, Any]:
    """The other flows count cycles."""
    return {"cycles": cycles}


def sft_sized(settings: Mapping[str, Any], cycles: int) -> dict[str, Any]:
    """SFT counts steps: a cycle is steps_per_cycle of them."""
    per_cycle = settings.get(
        "steps_per_cycle", by_command("sft").config.model_fields["steps_per_cycle"].default
    )
    return {"steps": cycles * int(per_cycle)}


SIZING: dict[str, tuple[tuple[str, ...], Callable[[Mapping[str, Any], int], dict[str, Any]]]] = {
    "sft": (("steps", "epochs", "cycles"), sft_sized),
}
"""The kinds whose rungs are not `cycles` (the others': `cycles`)."""

TRIAL_KINDS: dict[str, TrialKind] = {
    flow.command: TrialKind(
        flow.config, flow.deployment_path, *SIZING.get(flow.command, (("cycles",), cycles_sized))
    )
    for flow in TRAINING_FLOWS
}


def trial_kind(kind: str) -> TrialKind:
    """The kind named `kind`; ConfigError naming the known ones otherwise."""
    by_command(kind, "kind")  # the same refusal as every command's
    return TRIAL_KINDS[kind]
