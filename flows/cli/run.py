"""`whitney-flows run FLOW`, for every flow of flows.catalogue: once its config is checked,
check its trackers (a URI a tracker refuses, a tracking server that does not answer or
refuses the credentials, exits 2 before anything starts), reach Whitney (a URL that does not
answer, or refuses the key, exits 2 before any flow run starts) or start the embedded server,
run the flow with progress fed by its metrics JSON lines, download the exported adapter and
write its manifest beside it (`RUN-manifest.json`, flows.core.records.manifest), print a
summary table, then where the learning curves are (the summary artifact's picture, as a PNG
beside the metrics file: `--metrics-out`'s, else in the adapter directory) and the command
that exports the adapter. Exit codes as in `flows.cli.main`."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from prefect import Flow
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from blocks.connection import WhitneyConnection
from blocks.endpoint import (
    EMBEDDED_DATA_DIR_ENV,
    EMBEDDED_URL_ENV,
    check_served,
    check_whitney,
    resolve_endpoint,
)
from flows.catalogue import by_command
from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_FLOW_FAILED, EXIT_OK
from flows.cli.terminal import CycleProgress
from flows.cli.watchdog import watch
from flows.core.config import ConfigError, FlowConfig
from flows.core.records.manifest import archive_path, manifest_path, with_archive, write_manifest
from flows.core.records.plots import picture_beside
from flows.core.records.summary_parts import export_command
from flows.core.records.tracking.preflight import check_tracking
from whitney.client import API_KEY_ENV
from whitney.local import ServerStartError
from whitney.local.config import default_data_dir
from whitney.local.ownership import start_on_first_free
from whitney.local.tinker_endpoint import TINKER_URL_ENV, endpoint_of

ProgressFactory = Callable[[Path, Console], AbstractContextManager[Any]]
"""(metrics path, console) -> the progress display, entered around the flow run."""
Summarize = Callable[[Any, Path, float], Table]
"""(flow result, downloaded adapter path, wall seconds) -> the summary table."""
BACKLOG_S = 30.0
"""How long the run's end waits for Prefect's services to send what they hold."""


def run_flow(options: argparse.Namespace, prog: str | None = None) -> int:
    """`whitney-flows run FLOW` (a flow of flows.catalogue, what is its own in its
    `cli_module`): its exit code; 2 with one line (`prog: ...`) if its config is refused."""
    prog = prog or f"whitney-flows run {options.flow}"
    try:
        flow = by_command(options.flow)
        own = importlib.import_module(flow.cli_module)
        describe = getattr(own, flow.progress)
        check = flow.load_check()
        config = own.checked_config(options)
        return launch_flow(
            prog,
            config,
            flow.load_flow(),
            lambda metrics_path, console: CycleProgress(
                own.progress_bars(config, metrics_path), console, describe
            ),
            getattr(own, flow.summary_table),
            options.adapter_dir,
            None if check is None else lambda connection: check(config, connection),
        )
    except ConfigError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG


def launch_flow(
    prog: str,
    config: FlowConfig,
    flow: Flow[..., Any],
    progress: ProgressFactory,
    summarize: Summarize,
    adapter_dir: Path,
    check: Callable[[WhitneyConnection], None] | None = None,
) -> int:
    """Run `flow(config)` (a checked config) against Whitney; the exit code.

    The endpoint `resolve_endpoint` finds (a URL from the config or WHITNEY_API_URL) is
    probed first (`check_whitney`); with none, the embedded server runs for the duration.
    Either way its capabilities must list the config's base models (`check_served`). The
    result must have `run_id` and `adapter` (the exported adapter), downloaded to
    `adapter_dir`. `check` refuses (ConfigError) what only that Whitney can tell (a DPO
    reference checkpoint it does not hold).
    """
    console = Console()
    with ExitStack() as stack:
        try:
            check_tracking(config.tracking, reach=True)
            endpoint = resolve_endpoint(config.api_url, url_field="--api-url")
            if endpoint is None:
                connection, export_url = start_embedded_server(stack, console), None
                with connection.get_client() as client:
                    capabilities = client.capabilities()
            else:
                capabilities = check_whitney(endpoint)
                connection, export_url = endpoint.connection, endpoint.connection.base_url
            if capabilities is not None:
                check_served(config, capabilities)
            if check is not None:
                check(connection)
        except (ConfigError, ServerStartError) as error:
            print(f"{prog}: {error}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        temporary = not config.metrics_path  # then the picture goes to adapter_dir
        if config.metrics_path:
            metrics_path = Path(config.metrics_path)
        else:
            metrics_path = Path(stack.enter_context(TemporaryDirectory())) / "metrics.jsonl"
        update = {"api_url": connection.base_url, "metrics_path": str(metrics_path)}
        config = config.model_copy(update=update)
        try:
            start_ephemeral_prefect(console)
        except RuntimeError as error:
            print(f"{prog}: {prefect_start_failure(error)}", file=sys.stderr)
            return EXIT_FLOW_FAILED
        started = time.monotonic()
        try:
            with progress(metrics_path, console):
                state = flow(config, return_state=True)
        except KeyboardInterrupt:
            print(f"{prog}: interrupted; the Whitney run was cancelled", file=sys.stderr)
            return EXIT_FLOW_FAILED
        wall_seconds = time.monotonic() - started
        send_prefect_backlog()
        if not state.is_completed():
            print(f"{prog}: the flow run ended {state.name}: {state.message}", file=sys.stderr)
            return EXIT_FLOW_FAILED
        result = state.result()
        with connection.get_client() as client:
            adapter_path = client.download_artifact(
                result.adapter.artifact_id, archive_path(result.run_id, adapter_dir)
            )
        try:
            recorded = with_archive(result.manifest, adapter_path)
        except ValueError as error:
            print(f"{prog}: {error}", file=sys.stderr)
            return EXIT_FLOW_FAILED
        manifest = write_manifest(recorded, manifest_path(result.run_id, adapter_dir))
        console.print(summarize(result, adapter_path.resolve(), wall_seconds))
        console.print(f"Manifest: {manifest.resolve()}", soft_wrap=True, markup=False)
        picture = picture_beside(metrics_path)
        if picture.is_file():
            if temporary:
                picture = Path(
                    shutil.copyfile(picture, adapter_dir / f"{result.run_id}-learning-curves.png")
                )
            console.print(f"Learning curves: {picture.resolve()}", soft_wrap=True, markup=False)
        command = export_command(result.run_id, export_url, os.environ.get(EMBEDDED_DATA_DIR_ENV))
        console.print(f"Export the adapter: {command}", soft_wrap=True, markup=False)
    return EXIT_OK


def start_embedded_server(stack: ExitStack, console: Console) -> WhitneyConnection:
    """The embedded server, for the duration of `stack`, on the default data directory or,
    while another live server owns that one, on the first free `<dir>-2`, `<dir>-3`, ...;
    its connection. Its key goes in WHITNEY_API_KEY (where the cleanup hooks read it), its
    URL in WHITNEY_FLOWS_EMBEDDED_URL (the summary artifact's export command then needs no
    --api-url) and a directory other than the default in WHITNEY_FLOWS_EMBEDDED_DATA_DIR
    (the export commands name it)."""
    default = default_data_dir()
    tinker_url = os.environ.get(TINKER_URL_ENV) or None
    if tinker_url is not None:
        try:
            endpoint_of(tinker_url)
        except ValueError as exc:
            raise ServerStartError(f"{TINKER_URL_ENV}: {exc}") from None
    server = stack.enter_context(start_on_first_free(default, tinker_url=tinker_url))
    os.environ[API_KEY_ENV] = server.api_key
    os.environ[EMBEDDED_URL_ENV] = server.url
    stack.callback(os.environ.pop, EMBEDDED_URL_ENV, None)
    where = f"data: {server.data_dir}"
    if server.data_dir != default.expanduser().resolve():
        where += f"; {default} is another live server's"
        os.environ[EMBEDDED_DATA_DIR_ENV] = str(server.data_dir)  # export commands name it
        stack.callback(os.environ.pop, EMBEDDED_DATA_DIR_ENV, None)
    if tinker_url is not None:
        where += f"; provider tinker runs train at {endpoint_of(tinker_url)}"
    console.print(f"Embedded Whitney server at {server.url} ({where})", soft_wrap=True)
    return WhitneyConnection(base_url=server.url, api_key=SecretStr(server.api_key))


def start_ephemeral_prefect(console: Console) -> None:
    """With no PREFECT_API_URL, start Prefect's ephemeral API server now (the flow run reuses
    it), so that a server that does not come up fails here, as one line, not inside the flow,
    with a watchdog that stops it if this process dies without stopping it (SIGKILL,
    SIGTERM). Raises RuntimeError (Prefect's) when it does not start."""
    if PREFECT_API_URL.value():
        return
    console.print("Starting Prefect's ephemeral API server", soft_wrap=True)
    server = SubprocessASGIServer()
    server.start()
    if server.server_process is not None:
        watch(server.server_process.pid)


def send_prefect_backlog() -> None:
    """Let Prefect's background services send the events and logs they still hold (waiting up
    to BACKLOG_S), so that their notices come before the run's last line, not after it."""
    EventsWorker.drain_all(timeout=BACKLOG_S, at_exit=False)
    APILogWorker.drain_all(timeout=BACKLOG_S, at_exit=False)


def prefect_start_failure(error: RuntimeError) -> str:
    """The line to print when Prefect's ephemeral server did not start: Prefect's first
    sentence (its server's output follows it) and what to do."""
    reason = str(error).split(" stdout:", 1)[0].strip()
    timeout = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
    return (
        f"Prefect did not start: {reason} (waited {timeout} s: raise"
        " PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or set PREFECT_API_URL to a running"
        " `prefect server start`)"
    )
