"""`whitney-flows run rl`: validate the config, then (flows.cli.launch) reach Whitney (or start the
embedded server), run `rl_flow` with a progress bar, download the exported adapter and print a
summary."""

from __future__ import annotations

import argparse
import sys

from flows.cli.exit_codes import EXIT_BAD_CONFIG
from flows.cli.launch import launch_flow
from flows.cli.parsers import shared_overrides
from flows.cli.terminal import CycleProgress, summary_table
from flows.core.config import ConfigError, settings_with_overrides, validated
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.plan import check_rl_config

PROG = "whitney-flows run rl"


def rl_config_from(options: argparse.Namespace) -> RLConfig:
    """The config file (if any) with the command-line options on top; ConfigError if bad."""
    overrides = {
        **shared_overrides(options),
        "cycles": options.cycles,
        "env": options.env,
        "loss": options.loss,
    }
    data = settings_with_overrides(options.config, overrides)
    return validated(RLConfig, data)


def checked_config(options: argparse.Namespace) -> RLConfig:
    """The validated config, checked against the provider, before anything is allocated."""
    config = rl_config_from(options)
    check_rl_config(config)
    return config


def run_rl(options: argparse.Namespace) -> int:
    """Run the RL flow; the exit code."""
    try:
        config = checked_config(options)
    except ConfigError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return launch_flow(
        PROG,
        config,
        rl_flow,
        lambda metrics_path, console: CycleProgress(
            [("RL cycles", metrics_path, config.cycles)], console
        ),
        summary_table,
        options.adapter_dir,
    )
