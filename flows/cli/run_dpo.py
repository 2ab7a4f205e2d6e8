"""`whitney-flows run dpo`, what is DPO's own (flows.cli.run does the rest, as for every flow of
flows.catalogue): the config from the options (its pairs checked), its progress line and its
summary table with the held-out preference accuracy before and after."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from flows.cli.parsers import config_settings
from flows.cli.terminal import add_weights_rows, result_table
from flows.core.config import validated
from flows.dpo.config import DPOConfig
from flows.dpo.metrics import DPOResult
from flows.dpo.plan import check_dpo_config


def dpo_config_from(options: argparse.Namespace) -> DPOConfig:
    """The config file (if any), the command-line options on top, then each `--set`;
    ConfigError if bad."""
    overrides = {
        "cycles": options.cycles,
        "data_path": str(options.data) if options.data else None,
        "reference": options.reference,
        "beta": options.beta,
        "learning_rate": options.lr,
    }
    return validated(DPOConfig, config_settings(DPOConfig, options, overrides))


def checked_config(options: argparse.Namespace) -> DPOConfig:
    """The validated config, its pairs checked, before anything is allocated."""
    config = dpo_config_from(options)
    check_dpo_config(config)
    return config


def progress_bars(config: DPOConfig, metrics_path: Path) -> list[tuple[str, Path, int]]:
    """One bar over the cycles."""
    return [("DPO cycles", metrics_path, config.cycles)]


def describe_dpo_cycle(line: dict[str, Any]) -> str:
    """The progress bar's text after a DPO cycle's metrics line."""
    text = f"loss {line['loss']:.3f}  margin {line['margin']:.3f}"
    if line.get("eval.accuracy") is not None:
        text += f"  held-out accuracy {line['eval.accuracy']:.2f}"
    return text


def summary_table(result: DPOResult, adapter_path: Path, wall_seconds: float) -> Table:
    """The end-of-run table: cycles, time, held-out accuracy before and after, the weights."""
    table = result_table("DPO flow finished", ("cycles", str(len(result.cycles))), wall_seconds)
    table.add_row("reference", result.reference)
    for when, evaluation in (("before", result.eval_before), ("after", result.eval_after)):
        if evaluation is not None:
            table.add_row(f"held-out accuracy, {when}", f"{evaluation.accuracy:.3f}")
            table.add_row(
                f"held-out chosen preferred, {when}", f"{evaluation.chosen_preferred:.3f}"
            )
    if result.cycles:
        table.add_row("DPO loss, last cycle", f"{result.cycles[-1].loss:.4f}")
    runs = [("Whitney run", result.run_id), ("reference run", result.reference_run_id)]
    add_weights_rows(table, result, adapter_path, runs)
    return table
