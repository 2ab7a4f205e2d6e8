"""The `inspect` and `runs` commands of `whitney-flows` (their parsers: flows.cli.parsers).
No Prefect import: they start fast.

    whitney-flows inspect RUN_ID [--cycle N] [--json] [--api-url URL | --data-dir DIR]
    whitney-flows runs [--json] [--api-url URL | --data-dir DIR]

`inspect` and `runs` read the Whitney API at `--api-url` (else WHITNEY_API_URL), with the key
from WHITNEY_API_KEY, or an embedded server's data directory (`--data-dir`, else the one
`whitney-flows run` uses when neither URL is set: for a RUN_ID, the first of its directories,
`local`, `local-2`, ..., that holds the run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_NOT_FOUND, EXIT_OK

if TYPE_CHECKING:
    from flows.core.records.inspection_sources import ApiJournal, DataDirJournal


def journal_source(options: argparse.Namespace) -> ApiJournal | DataDirJournal:
    """The source `options` name (see the module docstring); ValueError saying what is
    missing."""
    from blocks.endpoint import resolve_endpoint
    from flows.core.config import ConfigError
    from flows.core.records.inspection_sources import ApiJournal, DataDirJournal

    if options.data_dir is None:
        try:
            endpoint = resolve_endpoint(options.api_url, url_field="--api-url")
        except ConfigError as error:
            raise ValueError(error.message) from None
        if endpoint is not None:
            return ApiJournal(endpoint.connection.get_client())
        options.data_dir = data_dir_holding(getattr(options, "run_id", None))
    try:
        return DataDirJournal(options.data_dir)
    except FileNotFoundError as error:
        raise ValueError(f"{error} (give --api-url or --data-dir)") from None


def data_dir_holding(run_id: str | None) -> Path:
    """The data directory `whitney-flows run` uses by default or, for a run started while a
    live server held that one, the first of its siblings (`local-2`, ...) whose journal holds
    `run_id`."""
    from flows.core.records.inspection_sources import DataDirJournal, RunNotFound
    from whitney.local.config import default_data_dir
    from whitney.local.ownership import siblings

    default = default_data_dir()
    if run_id is not None:
        for directory in siblings(default):
            if (directory / "journal.sqlite3").is_file():
                with contextlib.suppress(RunNotFound):
                    DataDirJournal(directory).run(run_id)
                    return directory
    return default


def run_inspection(options: argparse.Namespace) -> int:
    """`inspect` or `runs`; the exit code."""
    from rich.console import Console

    from flows.cli.inspection import render_run_report, render_runs_report
    from flows.core.records.inspection_journal import run_report as build_run_report
    from flows.core.records.inspection_journal import runs_report as build_runs_report
    from flows.core.records.inspection_sources import RunNotFound
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
