"""The training flows a sweep can run: each kind's config class, its deployment, and how a
rung sets its length. No Prefect. A new flow is one more entry in `TRIAL_KINDS`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flows.core.config import ConfigError, FlowConfig
from flows.dpo.config import DPOConfig
from flows.rl.config import RLConfig
from flows.sft.config import SFTConfig


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


def rl_sized(settings: Mapping[str, Any], cycles: int) -> dict[str, Any]:
    return {"cycles": cycles}


def sft_sized(settings: Mapping[str, Any], cycles: int) -> dict[str, Any]:
    """SFT counts steps: a cycle is steps_per_cycle of them."""
    per_cycle = settings.get("steps_per_cycle", SFTConfig.model_fields["steps_per_cycle"].default)
    return {"steps": cycles * int(per_cycle)}


TRIAL_KINDS: dict[str, TrialKind] = {
    "rl": TrialKind(RLConfig, "rl/rl-on-demand", ("cycles",), rl_sized),
    "sft": TrialKind(SFTConfig, "sft/sft-nightly", ("steps", "epochs", "cycles"), sft_sized),
    "dpo": TrialKind(DPOConfig, "dpo/dpo-on-demand", ("cycles",), rl_sized),
}


def trial_kind(kind: str) -> TrialKind:
    """The kind named `kind`; ConfigError naming the known ones otherwise."""
    if kind not in TRIAL_KINDS:
        raise ConfigError("kind", f"unknown flow kind {kind!r}: one of {', '.join(TRIAL_KINDS)}")
    return TRIAL_KINDS[kind]
