"""The `run distill`, `inspect` and `runs` commands of `whitney-flows`: their arguments, and
the handlers of the two that read journals. No Prefect import: `inspect` and `runs` start fast.

    whitney-flows run distill [--config FILE] [--cycles N] [--teacher sft|base]
                              [--teacher-checkpoint URI] [--task-runner thread|dask] ...
    whitney-flows inspect RUN_ID [--cycle N] [--json] [--api-url URL | --data-dir DIR]
    whitney-flows runs [--json] [--api-url URL | --data-dir DIR]

`inspect` and `runs` read the Whitney API at `--api-url` (else WHITNEY_API_URL), with the key
from WHITNEY_API_KEY, or an embedded server's data directory (`--data-dir`, else the one
`whitney-flows run` uses when neither URL is set).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from pydantic_core import PydanticUndefined

from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_NOT_FOUND, EXIT_OK
from flows.core.environments import ENVIRONMENTS
from whitney.losses import LOSS_FUNCTIONS
from whitney.wire import Provider

PROVIDERS: tuple[str, ...] = tuple(sorted(get_args(Provider)))
CONFIG_FIELDS = {"data": "data_path", "lr": "learning_rate", "chunk_size": "teacher_chunk_size"}
"""The config field of each `run FLOW` option not named like it."""


def one_of(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(names)


PROVIDER_HELP = f"Whitney provider: {one_of(PROVIDERS)}"
LOSS_HELP = f"loss function (its build_loss recipe): {one_of(LOSS_FUNCTIONS)}"
ENV_HELP = f"environment: {one_of(list(ENVIRONMENTS))}, or an import path module:attr"


class ConfigDefaultsFormatter(argparse.HelpFormatter):
    """`run FLOW --help`: each option's help ends with its default in the flow's config model
    (`config_model`, "module:Class"), imported only when the help is shown (with Prefect)."""

    def __init__(self, prog: str, config_model: str, **options: Any) -> None:
        super().__init__(prog, **options)
        self._config_model = config_model

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text is None or action.default is not None or "default" in text:
            return text
        default = self._default(CONFIG_FIELDS.get(action.dest, action.dest))
        return text if default is None else f"{text} (default: {str(default).replace('%', '%%')})"

    def _default(self, name: str) -> Any:
        module, _, attribute = self._config_model.partition(":")
        model = getattr(importlib.import_module(module), attribute)
        field = model.model_fields.get(name)
        return None if field is None or field.default is PydanticUndefined else field.default


def config_help(config_model: str) -> Callable[..., argparse.HelpFormatter]:
    """The formatter class of a `run FLOW` parser whose config model is `config_model`."""
    return functools.partial(ConfigDefaultsFormatter, config_model=config_model)


def add_distill_parser(flows: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`run distill` and its options (besides --api-url, --metrics-out and --adapter-dir)."""
    command = flows.add_parser(
        "distill",
        help="distillation: a frozen teacher's logprobs (fanned out) teach a student",
        formatter_class=config_help("flows.distill.plan:DistillationConfig"),
    )
    command.add_argument("--config", type=Path, metavar="FILE", help="DistillationConfig file")
    command.add_argument("--cycles", type=int, metavar="N", help="number of distillation cycles")
    command.add_argument(
        "--teacher",
        choices=("sft", "base"),
        default="sft",
        help="with no --teacher-checkpoint: train one by SFT on the built-in corpus first "
        "(default), or use the base model itself",
    )
    command.add_argument(
        "--teacher-checkpoint", metavar="URI", help="distill from this checkpoint (whitney://...)"
    )
    command.add_argument("--sft-steps", type=int, metavar="N", help="the SFT teacher's steps")
    command.add_argument("--provider", metavar="P", help=PROVIDER_HELP)
    command.add_argument("--base-model", metavar="M", help="base model")
    command.add_argument("--seed", type=int, metavar="S", help="seed of runs and sampling")
    command.add_argument(
        "--chunk-size", type=int, metavar="N", help="sequences per teacher logprobs task (0: all)"
    )
    command.add_argument(
        "--sequential-teacher",
        action="store_true",
        help="submit the teacher's logprobs calls one after another, not together",
    )
    command.add_argument(
        "--task-runner",
        choices=("thread", "dask"),
        help="where fanned-out tasks run: Prefect's thread pool (default) or Dask processes "
        "(pip install 'whitney-flows[dask]')",
    )
    command.add_argument(
        "--budget-tokens", type=int, metavar="N", help="stop before exceeding N billed tokens"
    )
    command.add_argument(
        "--budget-cost",
        type=float,
        metavar="USD",
        help="stop before exceeding this estimated cost (needs prices in --config or the block)",
    )
    return command


def add_source_options(command: argparse.ArgumentParser) -> None:
    source = command.add_mutually_exclusive_group()
    source.add_argument(
        "--api-url",
        metavar="URL",
        help="Whitney URL (default: $WHITNEY_API_URL); the key comes from $WHITNEY_API_KEY",
    )
    source.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="an embedded server's data directory (default, with no URL: the one "
        "`whitney-flows run` uses)",
    )
    command.add_argument("--json", action="store_true", help="print JSON instead of tables")


def add_inspection_parsers(commands: argparse._SubParsersAction) -> None:
    """`inspect RUN_ID` and `runs`."""
    inspect = commands.add_parser(
        "inspect",
        help="a run's journal per cycle: each operation's seq id, kind, status, time, usage",
    )
    inspect.add_argument("run_id", metavar="RUN_ID", help="the Whitney run")
    inspect.add_argument("--cycle", type=int, metavar="N", help="only cycle N")
    add_source_options(inspect)
    runs = commands.add_parser("runs", help="your Whitney sessions and runs, with their status")
    add_source_options(runs)


def journal_source(options: argparse.Namespace):
    """The source `options` name (see the module docstring); ValueError saying what is
    missing."""
    from flows.cli.inspection import ApiJournal, DataDirJournal
    from whitney.client import API_KEY_ENV, API_URL_ENV, WhitneyClient

    url = options.api_url or (None if options.data_dir else os.environ.get(API_URL_ENV))
    if url:
        key = os.environ.get(API_KEY_ENV)
        if not key:
            raise ValueError(f"reading {url} needs {API_KEY_ENV}")
        return ApiJournal(WhitneyClient(url, key))
    if options.data_dir is None:
        from whitney.local.config import default_data_dir

        options.data_dir = default_data_dir()
    try:
        return DataDirJournal(options.data_dir)
    except FileNotFoundError as error:
        raise ValueError(f"{error} (give --api-url or --data-dir)") from None


def run_inspection(options: argparse.Namespace) -> int:
    """`inspect` or `runs`; the exit code."""
    from rich.console import Console

    from flows.cli.inspection import RunNotFound, render_run_report, render_runs_report
    from flows.cli.inspection import run_report as build_run_report
    from flows.cli.inspection import runs_report as build_runs_report
    from whitney.errors import NotFound, WhitneyError

    prog = f"whitney-flows {options.command}"
    try:
        source = journal_source(options)
    except ValueError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    try:
        if options.command == "inspect":
            report = build_run_report(source, options.run_id, options.cycle)
        else:
            report = build_runs_report(source)
    except (RunNotFound, NotFound) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except WhitneyError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_NOT_FOUND
    finally:
        client = getattr(source, "client", None)
        if client is not None:
            client.close()
    if options.command == "inspect" and options.cycle is not None and not report["groups"]:
        cycles = report["cycles_in_journal"]
        known = f"{cycles[0]} to {cycles[-1]}" if cycles else "none"
        print(
            f"{prog}: run {options.run_id} has no cycle {options.cycle} (cycles: {known})",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    if options.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    console = Console()
    if options.command == "inspect":
        render_run_report(report, console)
    else:
        render_runs_report(report, console)
    return EXIT_OK
