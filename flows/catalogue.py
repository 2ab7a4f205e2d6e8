"""The training flows, one entry each: `whitney-flows run` (its subcommands, `--help`, `--set`),
`fork`, the sweep's kinds (flows.sweep.kinds), the automatic resume (flows.resume), the check of
deployments/prefect.yaml (tests/flows/test_catalogue.py) and docs/config.md all read this list,
so none of them can leave a flow out. No Prefect: the flow functions are named by their
entrypoints (as is a check on Whitney), the progress line and the summary table by their
functions in `cli_module`.

Adding a flow is one entry here, plus what it names: its config model, its flow (and its
deployment in deployments/prefect.yaml), and `flows/cli/run_COMMAND.py` with what is the
flow's own on the command line: `checked_config(options)`, `progress_bars(config,
metrics_path)`, the progress line and `summary_table` (flows.cli.run does the rest, the same for
every flow); every field of its config is then on the command line (`--set`) and in
docs/config.md.

    by_command("dpo").config                    # DPOConfig
    by_name("distillation").command             # "distill" (a manifest's `flow`)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flows.core.config import ConfigError, FlowConfig
from flows.distill.config import DistillationConfig
from flows.dpo.config import DPOConfig
from flows.rl.config import RLConfig
from flows.sft.config import SFTConfig


@dataclass(frozen=True)
class TrainingFlow:
    """A training flow: its names, its config model, where Prefect finds it."""

    name: str
    """The Prefect flow's name, which a manifest's `flow` records."""
    command: str
    """`whitney-flows run COMMAND` (module flows.cli.run_COMMAND) and a sweep's `kind`."""
    config: type[FlowConfig]
    entrypoint: str
    """The flow function, as deployments/prefect.yaml names it (path:function)."""
    deployment: str
    """Its deployment in deployments/prefect.yaml."""
    summary: str
    """One line: what the flow does (`run --help`, docs/config.md)."""
    progress: str
    """The function of `cli_module` that turns a metrics line into the progress line."""
    check: str | None = None
    """The function (path:function) that refuses, before the flow runs, what only the Whitney
    it reaches can tell: `check(config, connection)` raises ConfigError."""

    @property
    def cli_module(self) -> str:
        """The module of what is the flow's own in `whitney-flows run COMMAND`."""
        return f"flows.cli.run_{self.command}"

    @property
    def summary_table(self) -> str:
        """The function of `cli_module` that makes the end-of-run summary table."""
        return "summary_table"

    def load_flow(self) -> Any:
        """The flow function `entrypoint` names (imports Prefect)."""
        return loaded(self.entrypoint)

    def load_check(self) -> Callable[[Any, Any], None] | None:
        """The function `check` names, if any."""
        return None if self.check is None else loaded(self.check)

    @property
    def deployment_path(self) -> str:
        """flow/deployment, as prefect.deployments.run_deployment names it."""
        return f"{self.name}/{self.deployment}"


TRAINING_FLOWS: tuple[TrainingFlow, ...] = (
    TrainingFlow(
        "rl",
        "rl",
        RLConfig,
        "flows/rl/flow.py:rl_flow",
        "rl-on-demand",
        "RL: group sampling, rewards, advantages, build_loss",
        "describe_rl_cycle",
    ),
    TrainingFlow(
        "sft",
        "sft",
        SFTConfig,
        "flows/sft/flow.py:sft_flow",
        "sft-nightly",
        "SFT: (prompt, completion) pairs, cross_entropy, eval loss",
        "describe_sft_cycle",
    ),
    TrainingFlow(
        "distillation",
        "distill",
        DistillationConfig,
        "flows/distill/flow.py:distillation_flow",
        "distill-on-demand",
        "distillation: a frozen teacher's logprobs (fanned out) teach a student",
        "describe",
    ),
    TrainingFlow(
        "dpo",
        "dpo",
        DPOConfig,
        "flows/dpo/flow.py:dpo_flow",
        "dpo-on-demand",
        "DPO: preference pairs, a frozen reference, the importance-sampling gradient",
        "describe_dpo_cycle",
        "flows/dpo/reference.py:check_reference",
    ),
)
COMMANDS: tuple[str, ...] = tuple(flow.command for flow in TRAINING_FLOWS)
DEPLOYMENTS: tuple[str, ...] = tuple(flow.deployment for flow in TRAINING_FLOWS)


def by_command(command: str, field: str = "FLOW") -> TrainingFlow:
    """The flow `whitney-flows run COMMAND` runs; ConfigError naming `field` and the known
    commands otherwise."""
    for flow in TRAINING_FLOWS:
        if flow.command == command:
            return flow
    raise ConfigError(field, f"unknown training flow {command!r}: one of {', '.join(COMMANDS)}")


def by_name(name: str | None) -> TrainingFlow | None:
    """The flow whose Prefect name is `name` (a manifest's `flow`), if any."""
    return next((flow for flow in TRAINING_FLOWS if flow.name == name), None)


def loaded(entrypoint: str) -> Any:
    """The function a `path/to/module.py:function` entrypoint names."""
    path, name = entrypoint.split(":")
    return getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
