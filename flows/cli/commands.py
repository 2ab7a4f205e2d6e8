"""The `inspect` and `runs` commands of `whitney-flows` (their parsers: flows.cli.parsers).
No Prefect import: they start fast.

    whitney-flows inspect RUN_ID [--cycle N] [--json] [--api-url URL | --data-dir DIR]
    whitney-flows runs [--json] [--api-url URL | --data-dir DIR]

`inspect` and `runs` read the Whitney API at `--api-url` (else WHITNEY_API_URL), with the key
from WHITNEY_API_KEY, or an embedded server's data directory (`--data-dir`, else the one
`whitney-flows run` uses when neither URL is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_NOT_FOUND, EXIT_OK


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
