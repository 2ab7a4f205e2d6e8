"""docs/config.md, generated from the config models' field descriptions: every field of every
flow of flows.catalogue (as `--set` names it) and of the sweep's config, with its type, default
and description. `whitney-flows docs config --out docs/config.md` rewrites it;
tests/flows/cli/test_settings.py fails when it is stale. No Prefect."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import BaseModel

from flows.catalogue import TRAINING_FLOWS
from flows.cli.exit_codes import EXIT_OK
from flows.cli.settings import default_text, settable_fields, type_text
from flows.core.evaluation.config import EvalSettings
from flows.sweep.config import SweepConfig

HEADER = """# Config reference

Every setting of every flow, generated from the config models' field descriptions
(`whitney-flows docs config --out docs/config.md`; a test fails when this page is stale).
Each is a key of a `--config` file (TOML or JSON; dotted names are tables), a field of the
deployment's run form in the Prefect UI, and `whitney-flows run FLOW --set FIELD=VALUE` on the
command line (VALUE as JSON, else text; repeatable; `run FLOW --help` lists them too). An old
name of a renamed field still works, with one deprecation line.
"""


OTHER_CONFIGS: tuple[tuple[str, type[BaseModel], str], ...] = (
    (
        "`sweep`",
        SweepConfig,
        "A sweep's own config file ([Sweeps](sweeps.md)); its trials' settings are the fields "
        "of their flow above.",
    ),
    (
        "evaluation settings",
        EvalSettings,
        "What an evaluation samples and scores: the `evaluation` of the evaluate-checkpoint "
        "and promote-checkpoint deployments, and of every `whitney.checkpoint.saved` event "
        "(each training flow derives it from its config; [Evaluate, promote and "
        "watch](evaluation.md)).",
    ),
)
"""The other configs, with a line each."""


def cell(text: str) -> str:
    """Text fit for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def model_table(model: type[BaseModel]) -> list[str]:
    """The table of every settable field of `model`."""
    lines = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for setting in settable_fields(model):
        description = setting.field.description or ""
        kind, default = type_text(setting.annotation), default_text(setting.field)
        lines.append(
            f"| `{setting.path}` | {cell(kind)} | `{cell(default)}` | {cell(description)} |"
        )
    return lines


def renamed_lines(model: type[BaseModel]) -> list[str]:
    """The old names `model` still takes, if any."""
    renamed = getattr(model, "RENAMED", {})
    return [f"Old names: {', '.join(f'`{old}` (now `{new}`)' for old, new in renamed.items())}."]


def reference_markdown() -> str:
    """docs/config.md's text."""
    lines = [HEADER]
    for flow in TRAINING_FLOWS:
        lines += [
            f"## `run {flow.command}`: {flow.config.__name__}",
            "",
            f"{flow.summary[0].upper()}{flow.summary[1:]} (deployment `{flow.deployment}`).",
            "",
            *model_table(flow.config),
            "",
        ]
        if getattr(flow.config, "RENAMED", None):
            lines += [*renamed_lines(flow.config), ""]
    for title, model, text in OTHER_CONFIGS:
        lines += [f"## {title}: {model.__name__}", "", text, "", *model_table(model), ""]
        if getattr(model, "RENAMED", None):
            lines += [*renamed_lines(model), ""]
    return "\n".join(lines)


def write_reference(options: argparse.Namespace) -> int:
    """`whitney-flows docs config [--out FILE]`; the exit code."""
    text = reference_markdown()
    if options.out is None:
        print(text, end="")
    else:
        Path(options.out).write_text(text, encoding="utf-8")
    return EXIT_OK
