"""`whitney-flows run rl`: validate the config, reach Whitney (or start the embedded server),
run `rl_flow` with a progress bar, download the exported adapter and print a summary."""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from rich.console import Console

from flows.cli import EXIT_BAD_CONFIG, EXIT_FLOW_FAILED, EXIT_OK
from flows.config import ConfigError, RLConfig, read_config_file, validated
from flows.connection import resolve_connection
from flows.metrics import RLResult
from flows.rl import rl_flow
from flows.rl_plan import check_rl_config
from flows.terminal import CycleProgress, summary_table
from tasks.connection import client_for
from whitney.client import API_KEY_ENV, API_URL_ENV
from whitney.local import EmbeddedWhitney, ServerStartError
from whitney.local.config import default_data_dir

PROG = "whitney-flows run rl"


def rl_config_from(options: argparse.Namespace) -> RLConfig:
    """The config file (if any) with the command-line options on top; ConfigError if bad."""
    data: dict[str, Any] = read_config_file(options.config) if options.config else {}
    overrides = {
        "cycles": options.cycles,
        "env": options.env,
        "loss": options.loss,
        "provider": options.provider,
        "base_model": options.base_model,
        "seed": options.seed,
        "api_url": options.api_url,
        "metrics_path": str(options.metrics_out) if options.metrics_out else None,
    }
    data.update({name: value for name, value in overrides.items() if value is not None})
    return validated(RLConfig, data)


def checked_config(options: argparse.Namespace) -> RLConfig:
    """The validated config, checked against the provider, before anything is allocated."""
    config = rl_config_from(options)
    check_rl_config(config)
    if (config.api_url or os.environ.get(API_URL_ENV)) and not os.environ.get(API_KEY_ENV):
        raise ConfigError("api_url", f"a Whitney URL is set but {API_KEY_ENV} is not")
    return config


def run_rl(options: argparse.Namespace) -> int:
    """Run the RL flow; the exit code."""
    console = Console()
    try:
        config = checked_config(options)
    except ConfigError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    with ExitStack() as stack:
        api_url = config.api_url or os.environ.get(API_URL_ENV)
        if not api_url:
            try:
                server = stack.enter_context(EmbeddedWhitney(data_dir=default_data_dir()))
            except ServerStartError as error:
                print(f"{PROG}: {error}", file=sys.stderr)
                return EXIT_BAD_CONFIG
            os.environ[API_KEY_ENV] = server.api_key  # the cleanup hooks read it from here
            api_url = server.url
            console.print(
                f"Embedded Whitney server at {api_url} (data: {server.data_dir})", soft_wrap=True
            )
        if config.metrics_path:
            metrics_path = Path(config.metrics_path)
        else:
            metrics_path = Path(stack.enter_context(TemporaryDirectory())) / "metrics.jsonl"
        config = config.model_copy(update={"api_url": api_url, "metrics_path": str(metrics_path)})
        started = time.monotonic()
        try:
            with CycleProgress(metrics_path, config.cycles, console):
                state = rl_flow(config, return_state=True)
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted; the Whitney run was cancelled", file=sys.stderr)
            return EXIT_FLOW_FAILED
        wall_seconds = time.monotonic() - started
        if not state.is_completed():
            print(f"{PROG}: the flow run ended {state.name}: {state.message}", file=sys.stderr)
            return EXIT_FLOW_FAILED
        result: RLResult = state.result()
        adapter_path = client_for(resolve_connection(api_url)).download_artifact(
            result.adapter.artifact_id, options.adapter_dir / f"{result.run_id}-adapter.tar"
        )
        console.print(summary_table(result, adapter_path.resolve(), wall_seconds))
    return EXIT_OK
