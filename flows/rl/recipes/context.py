"""The `ctx` of `build_loss(sample, cycle, request, ctx)` (Whitney's Loop building blocks):
what a recipe sees of its group, its run and the auxiliary runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tasks.operation_client import OperationClient


class AuxiliaryRunRef(Protocol):
    """An auxiliary run as a recipe sees it in `ctx.runs` (a critic, a frozen reference)."""

    @property
    def run_id(self) -> str: ...

    @property
    def sampler_id(self) -> str | None: ...


@dataclass(frozen=True)
class LossContext:
    """The ctx (client, run_id, sampler_id, provider) for one group, plus the group's
    rewards and advantages and the configured loss_config.

    `runs` holds the auxiliary runs the recipe declared, by name; their calls go through
    `client` too (each run has its own seq ids in the cycle's ledger). `scratch` is one dict
    per cycle, shared by the cycle's build_loss calls and the recipe's finish_cycle (rebuilt
    when a cycle replays)."""

    client: OperationClient
    run_id: str
    sampler_id: str
    provider: str
    loss_config: Mapping[str, float]
    rewards: list[float]
    advantages: list[float]
    runs: Mapping[str, AuxiliaryRunRef] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)
