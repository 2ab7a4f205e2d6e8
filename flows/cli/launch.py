"""What every `whitney-flows run FLOW` does once its config is checked: reach Whitney (a URL
that does not answer, or refuses the key, exits 2 before any flow run starts) or start the
embedded server, run the flow with progress fed by its metrics JSON lines, download the
exported adapter and print a summary table, then the command that exports the adapter. Exit
codes as in `flows.cli.main`."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from prefect import Flow
from rich.console import Console
from rich.table import Table

from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_FLOW_FAILED, EXIT_OK
from flows.core.config import ConfigError, FlowConfig
from flows.core.connection import EMBEDDED_URL_ENV, check_whitney, resolve_connection
from flows.core.summary import export_command
from tasks.connection import client_for
from whitney.client import API_KEY_ENV, API_URL_ENV
from whitney.local import EmbeddedWhitney, ServerStartError
from whitney.local.config import default_data_dir

ProgressFactory = Callable[[Path, Console], AbstractContextManager[Any]]
"""(metrics path, console) -> the progress display, entered around the flow run."""
Summarize = Callable[[Any, Path, float], Table]
"""(flow result, downloaded adapter path, wall seconds) -> the summary table."""


def check_api_key(config: FlowConfig) -> None:
    """ConfigError if a Whitney URL is set (config or environment) but no key is."""
    if (config.api_url or os.environ.get(API_URL_ENV)) and not os.environ.get(API_KEY_ENV):
        raise ConfigError("api_url", f"a Whitney URL is set but {API_KEY_ENV} is not")


def launch_flow(
    prog: str,
    config: FlowConfig,
    flow: Flow[..., Any],
    progress: ProgressFactory,
    summarize: Summarize,
    adapter_dir: Path,
) -> int:
    """Run `flow(config)` (a checked config) against Whitney; the exit code.

    A URL (config or WHITNEY_API_URL) is probed first (`check_whitney`); with none, the
    embedded server runs for the duration. The result must have `run_id` and `adapter` (the
    exported adapter), downloaded to `adapter_dir`.
    """
    console = Console()
    with ExitStack() as stack:
        api_url = config.api_url or os.environ.get(API_URL_ENV)
        export_url = api_url
        try:
            if api_url:
                check_whitney(api_url, "--api-url" if config.api_url else API_URL_ENV)
            else:
                api_url = start_embedded_server(stack, console)
        except (ConfigError, ServerStartError) as error:
            print(f"{prog}: {error}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        if config.metrics_path:
            metrics_path = Path(config.metrics_path)
        else:
            metrics_path = Path(stack.enter_context(TemporaryDirectory())) / "metrics.jsonl"
        config = config.model_copy(update={"api_url": api_url, "metrics_path": str(metrics_path)})
        started = time.monotonic()
        try:
            with progress(metrics_path, console):
                state = flow(config, return_state=True)
        except KeyboardInterrupt:
            print(f"{prog}: interrupted; the Whitney run was cancelled", file=sys.stderr)
            return EXIT_FLOW_FAILED
        wall_seconds = time.monotonic() - started
        if not state.is_completed():
            print(f"{prog}: the flow run ended {state.name}: {state.message}", file=sys.stderr)
            return EXIT_FLOW_FAILED
        result = state.result()
        adapter_path = client_for(resolve_connection(api_url)).download_artifact(
            result.adapter.artifact_id, adapter_dir / f"{result.run_id}-adapter.tar"
        )
        console.print(summarize(result, adapter_path.resolve(), wall_seconds))
        command = export_command(result.run_id, export_url)
        console.print(f"Export the adapter: {command}", soft_wrap=True, markup=False)
    return EXIT_OK


def start_embedded_server(stack: ExitStack, console: Console) -> str:
    """The embedded server, for the duration of `stack`; its URL. Its key goes in
    WHITNEY_API_KEY (where the cleanup hooks read it), its URL in WHITNEY_FLOWS_EMBEDDED_URL
    (the summary artifact's export command then needs no --api-url)."""
    server = stack.enter_context(EmbeddedWhitney(data_dir=default_data_dir()))
    os.environ[API_KEY_ENV] = server.api_key
    os.environ[EMBEDDED_URL_ENV] = server.url
    stack.callback(os.environ.pop, EMBEDDED_URL_ENV, None)
    console.print(
        f"Embedded Whitney server at {server.url} (data: {server.data_dir})", soft_wrap=True
    )
    return server.url
