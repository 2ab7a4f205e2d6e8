"""`whitney-flows run distill`: the distillation demo.

With no teacher given, it first trains a teacher by SFT on the built-in corpus (an SFT subflow
of the distillation flow run; its final checkpoint is the teacher), then distills a fresh
student from it: `teacher_kl` falls over the cycles, and the student's eval loss on the
corpus's held-out split approaches the teacher's. What is distillation's own (flows.cli.run
does the rest, as for every flow of flows.catalogue): the config from the options, its
progress bars (the teacher's SFT, then the distillation) and line, its summary table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from flows.cli.parsers import config_settings
from flows.cli.terminal import add_weights_rows, result_table
from flows.core.config import validated
from flows.core.loop.budget import check_budget
from flows.core.loop.cost import cost_model, format_cost, format_usage
from flows.core.records.summary_parts import first_and_last
from flows.distill.config import DistillationConfig, teacher_metrics_path
from flows.distill.metrics import DistillationResult
from flows.distill.plan import check_distill_config
from flows.sft.config import SFTConfig


def distill_config_from(options: argparse.Namespace) -> DistillationConfig:
    """The config file (if any), the command-line options and each `--set` on top;
    ConfigError if bad.

    No teacher in any (`--teacher-checkpoint`, or `teacher_checkpoint` / `teacher_sft` in the
    file or a `--set`) means the demo's: an SFT teacher on the built-in corpus, unless
    `--teacher base`.
    """
    overrides = {
        "cycles": options.cycles,
        "teacher_checkpoint": options.teacher_checkpoint,
        "teacher_chunk_size": options.chunk_size,
        "task_runner": options.task_runner,
        "max_staleness": options.max_staleness,
    }
    data = config_settings(DistillationConfig, options, overrides)
    if options.sequential_teacher:
        data["teacher_fan_out"] = False
    budget = dict(data.get("budget") or {})
    if options.budget_tokens is not None:
        budget["max_tokens"] = options.budget_tokens
    if options.budget_cost is not None:
        budget["max_cost"] = options.budget_cost
    if budget:
        data["budget"] = budget
    wants_sft = options.teacher == "sft" or options.sft_steps is not None
    if wants_sft and not data.get("teacher_checkpoint"):
        sft = dict(data.get("teacher_sft") or {})
        if options.sft_steps is not None:
            sft["steps"] = options.sft_steps
        data["teacher_sft"] = sft
    elif options.teacher == "base":
        data.pop("teacher_sft", None)
    return validated(DistillationConfig, data)


def checked_config(options: argparse.Namespace) -> DistillationConfig:
    """The validated config, checked against the provider, before anything is allocated."""
    config = distill_config_from(options)
    check_distill_config(config)
    check_budget(config.budget, cost_model(config.prices))  # the CLI names no block
    return config


def progress_bars(config: DistillationConfig, metrics_path: Path) -> list[tuple[str, Path, int]]:
    """A bar over the distillation cycles, after one over the teacher's SFT cycles if it
    trains one."""
    bars = [("distillation cycles", metrics_path, config.cycles)]
    sft_config = config.teacher_sft_config()
    if sft_config is not None:
        sft_path = Path(teacher_metrics_path(str(metrics_path)))
        bars.insert(0, ("teacher SFT cycles", sft_path, sft_cycles(sft_config)))
    return bars


def sft_cycles(config: SFTConfig) -> int:
    from flows.sft.plan import load_sft_plan

    return load_sft_plan(config).cycles


def describe(line: dict[str, Any]) -> str:
    """The progress bar's text after a cycle's metrics line (distillation or SFT)."""
    if "teacher_kl" in line:
        return (
            f"teacher_kl {line['teacher_kl']:.4f}  teacher {line['teacher_seconds']:.2f} s "
            f"({line['teacher_chunks']} tasks)"
        )
    text = f"step {line.get('step_end')}  train {line.get('train_loss', 0.0):.3f}"
    if line.get("eval_loss") is not None:
        text += f"  eval {line['eval_loss']:.3f}"
    return text


def summary_table(result: DistillationResult, adapter_path: Path, wall_seconds: float) -> Table:
    """The end-of-run table: teacher_kl first and last, eval losses, usage, cost, weights."""
    cycles = ("cycles", str(len(result.cycles)))
    table = result_table("Distillation flow finished", cycles, wall_seconds)
    table.add_row("teacher", result.teacher)
    if result.teacher_sft is not None and result.teacher_sft.eval_losses:
        losses = result.teacher_sft.eval_losses
        table.add_row("teacher SFT eval loss", f"{losses[0]:.4f} -> {losses[-1]:.4f}")
    for label, kl in first_and_last("teacher_kl", result.cycles, lambda c: c.teacher_kl, 3):
        table.add_row(label, f"{kl:.4f}")
    if result.eval is not None:
        table.add_row("eval loss, teacher", f"{result.eval.teacher:.4f}")
        table.add_row(
            "eval loss, student",
            f"{result.eval.student_before:.4f} -> {result.eval.student_after:.4f}",
        )
    for run, usage in result.usage.items():  # student, teacher[, teacher_sft]
        table.add_row(f"tokens, {run}", format_usage(usage))
    table.add_row("tokens, total", f"{result.total_tokens:,}")
    table.add_row("estimated cost", format_cost(result.cost))
    if result.budget_stop:
        table.add_row("stopped early", result.budget_stop)
    runs = [("student run", result.run_id), ("teacher run", result.teacher_run_id)]
    add_weights_rows(table, result, adapter_path, runs)
    return table
