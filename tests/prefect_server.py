"""The tests' one way to start a Prefect server of their own beside the session's in-process
harness: `prefect server start` on a free loopback port, a Prefect home of its own (SQLite
there unless its settings name another database), the project's SERVER_SETTINGS, in a process
group of its own stopped by PID (tests/e2e/harness.py's ManagedProcess). The end-to-end
stack, the Tinker provider's flow tests and the small-page Prefect API all start it so."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from flows.core.orchestration.prefect_env import SERVER_SETTINGS
from tests.e2e.harness import ManagedProcess, PrefectAPI, executable, free_port, wait_for

START_TIMEOUT_S = 180.0
PREFECT_SERVER = "prefect-server"


def prefect_server_argv(port: int) -> list[str]:
    """`prefect server start` on 127.0.0.1:`port`."""
    return [executable("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]


def server_environment(home: Path, settings: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: a Prefect home of its own, the project's server settings,
    then `settings`."""
    home.mkdir(parents=True, exist_ok=True)
    env = os.environ | SERVER_SETTINGS | dict(settings) | {"PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    return env


@contextmanager
def prefect_server(tmp: Path, settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """A Prefect server with its home and log under `tmp` and `settings` on top of the
    project's, until the block ends: its API URL (…/api), once it answers its health check."""
    port = free_port()
    api = PrefectAPI(f"http://127.0.0.1:{port}/api")
    env = server_environment(tmp / "prefect-home", settings or {})
    process = ManagedProcess(PREFECT_SERVER, prefect_server_argv(port), env, tmp)
    try:

        def answers() -> bool:
            process.check_running()
            return api.healthy()

        wait_for("the Prefect server's health check", answers, START_TIMEOUT_S, 0.2, process.tail)
        yield api.api_url
    finally:
        process.stop(timeout=30)
        api.close()
