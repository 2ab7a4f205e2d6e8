"""The `export` command of `whitney-flows` (in progress)."""

from __future__ import annotations

import argparse


def add_export_parser(commands: argparse._SubParsersAction) -> None:
    """`export RUN_ID --out DIR [--merged]`."""
    commands.add_parser("export", help="a run's adapter as Hugging Face model directories")


def run_export(options: argparse.Namespace) -> int:
    """`export`; the exit code."""
    raise NotImplementedError
