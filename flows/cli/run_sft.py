"""`whitney-flows run sft`, what is SFT's own (flows.cli.run does the rest, as for every flow of
flows.catalogue): the config from the options (its data read and checked), its progress line
and its summary table with the first and last eval loss."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from flows.cli.parsers import config_settings
from flows.cli.terminal import add_weights_rows, result_table
from flows.core.config import validated
from flows.sft.config import SFTConfig
from flows.sft.metrics import SFTResult
from flows.sft.plan import check_sft_config


def sft_config_from(options: argparse.Namespace) -> SFTConfig:
    """The config file (if any), the command-line options on top, then each `--set`;
    ConfigError if bad.
    `--steps` clears an `epochs` of the file; `--epochs` takes precedence over its steps."""
    overrides = {
        "steps": options.steps,
        "epochs": options.epochs,
        "data_path": str(options.data) if options.data else None,
        "learning_rate": options.lr,
        "schedule": options.schedule,
    }
    cleared = ("epochs",) if options.steps is not None else ()
    return validated(SFTConfig, config_settings(SFTConfig, options, overrides, cleared))


def checked_config(options: argparse.Namespace) -> SFTConfig:
    """The validated config, its data read and checked, before anything is allocated."""
    config = sft_config_from(options)
    check_sft_config(config)
    return config


def progress_bars(config: SFTConfig, metrics_path: Path) -> list[tuple[str, Path, int]]:
    """One bar over the cycles of the config's plan."""
    return [("SFT cycles", metrics_path, check_sft_config(config).cycles)]


def describe_sft_cycle(line: dict[str, Any]) -> str:
    """The progress bar's text after an SFT cycle's metrics line."""
    text = f"step {line['step_end']}  train {line['train_loss']:.3f}"
    if line.get("eval_loss") is not None:
        text += f"  eval {line['eval_loss']:.3f}"
    return text + f"  lr {line['learning_rate']:.2e}"


def summary_table(result: SFTResult, adapter_path: Path, wall_seconds: float) -> Table:
    """The end-of-run table: steps, time, eval loss first and last, and where the weights are."""
    steps = ("steps", f"{result.steps} in {len(result.cycles)} cycles")
    table = result_table("SFT flow finished", steps, wall_seconds)
    if result.eval_losses:
        first, last = result.eval_losses[0], result.eval_losses[-1]
        table.add_row(f"eval loss, step {result.eval_steps[0]}", f"{first:.4f}")
        table.add_row(
            f"eval loss, step {result.eval_steps[-1]}", f"{last:.4f} ({last / first:.2f}x)"
        )
    if result.cycles:
        table.add_row("train loss, last cycle", f"{result.cycles[-1].train_loss:.4f}")
    add_weights_rows(table, result, adapter_path, [("Whitney run", result.run_id)])
    return table
