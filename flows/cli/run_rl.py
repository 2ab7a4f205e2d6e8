"""`whitney-flows run rl`, what is RL's own (flows.cli.run does the rest, as for every flow of
flows.catalogue): the config from the options, its progress line and its summary table."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from flows.cli.parsers import config_settings
from flows.cli.terminal import add_weights_rows, result_table
from flows.core.config import validated
from flows.core.records.summary_parts import first_and_last
from flows.rl.config import RLConfig
from flows.rl.metrics import CycleMetrics, RLResult
from flows.rl.plan import check_rl_config


def rl_config_from(options: argparse.Namespace) -> RLConfig:
    """The config file (if any), the command-line options on top, then each `--set`;
    ConfigError if bad."""
    overrides = {
        "cycles": options.cycles,
        "env": options.env,
        "loss": options.loss,
        "max_staleness": options.max_staleness,
    }
    return validated(RLConfig, config_settings(RLConfig, options, overrides))


def checked_config(options: argparse.Namespace) -> RLConfig:
    """The validated config, checked against the provider, before anything is allocated."""
    config = rl_config_from(options)
    check_rl_config(config)
    return config


def progress_bars(config: RLConfig, metrics_path: Path) -> list[tuple[str, Path, int]]:
    """One bar over the cycles."""
    return [("RL cycles", metrics_path, config.cycles)]


def describe_rl_cycle(line: dict[str, Any]) -> str:
    """The progress text after an RL cycle's metrics line."""
    metrics = CycleMetrics.model_validate(line)
    text = (
        f"reward {metrics.reward_mean:.3f}  loss {metrics.loss:+.3f}  "
        f"grad_norm {metrics.grad_norm:.3f}"
    )
    if metrics.episodes is not None:  # a multi-turn environment
        text += f"  turns {metrics.episodes.turns_per_episode:.2f}"
        if metrics.episodes.failed:
            text += f"  failed {metrics.episodes.failed}"
    return text


def summary_table(result: RLResult, adapter_path: Path, wall_seconds: float) -> Table:
    """The end-of-run table: cycles, time, reward first and last, and where the weights are."""
    table = result_table("RL flow finished", ("cycles", str(len(result.cycles))), wall_seconds)
    for label, reward in first_and_last("reward", result.cycles, lambda c: c.reward_mean, 5):
        table.add_row(label, f"{reward:.3f}")
    table.add_row("final loss", f"{result.cycles[-1].loss:+.4f}")
    add_weights_rows(table, result, adapter_path, [("Whitney run", result.run_id)])
    return table
