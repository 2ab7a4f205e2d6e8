"""`whitney-flows run rl`: validate the config, then (flows.cli.run) reach Whitney (or start the
embedded server), run `rl_flow` with a progress bar, download the exported adapter and print a
summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from flows.cli.parsers import shared_overrides
from flows.cli.run import launch_flow
from flows.cli.settings import apply_settings
from flows.cli.terminal import CycleProgress, add_weights_rows, describe_rl_cycle, result_table
from flows.core.config import settings_with_overrides, validated
from flows.core.records.summary_parts import first_and_last
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.metrics import RLResult
from flows.rl.plan import check_rl_config

PROG = "whitney-flows run rl"


def rl_config_from(options: argparse.Namespace) -> RLConfig:
    """The config file (if any), the command-line options on top, then each `--set`;
    ConfigError if bad."""
    overrides = {
        **shared_overrides(options),
        "cycles": options.cycles,
        "env": options.env,
        "loss": options.loss,
        "max_staleness": options.max_staleness,
    }
    data = settings_with_overrides(options.config, overrides)
    return validated(RLConfig, apply_settings(RLConfig, data, options.set))


def checked_config(options: argparse.Namespace) -> RLConfig:
    """The validated config, checked against the provider, before anything is allocated."""
    config = rl_config_from(options)
    check_rl_config(config)
    return config


def summary_table(result: RLResult, adapter_path: Path, wall_seconds: float) -> Table:
    """The end-of-run table: cycles, time, reward first and last, and where the weights are."""
    table = result_table("RL flow finished", ("cycles", str(len(result.cycles))), wall_seconds)
    for label, reward in first_and_last("reward", result.cycles, lambda c: c.reward_mean, 5):
        table.add_row(label, f"{reward:.3f}")
    table.add_row("final loss", f"{result.cycles[-1].loss:+.4f}")
    add_weights_rows(table, result, adapter_path, [("Whitney run", result.run_id)])
    return table


def run(options: argparse.Namespace) -> int:
    """Run the RL flow; the exit code (ConfigError: the config is refused)."""
    config = checked_config(options)
    return launch_flow(
        PROG,
        config,
        rl_flow,
        lambda metrics_path, console: CycleProgress(
            [("RL cycles", metrics_path, config.cycles)], console, describe_rl_cycle
        ),
        summary_table,
        options.adapter_dir,
    )
