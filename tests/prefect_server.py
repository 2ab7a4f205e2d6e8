"""A `prefect server start` (SQLite, the project's SERVER_SETTINGS) on a free loopback port, for
the Tinker provider's flow tests: their CLI runs reach it by PREFECT_API_URL instead of each
starting Prefect's ephemeral server (and migrating a new database) of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from flows.core.orchestration.prefect_env import SERVER_SETTINGS

START_TIMEOUT_S = 180.0


@contextmanager
def running(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A process of its own session (its children with it), terminated on exit."""
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield process
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def healthy(api_url: str) -> bool:
    """The Prefect API answers its health check."""
    try:
        return httpx.get(f"{api_url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def server_environment(home: Path) -> dict[str, str]:
    """The server's environment: a Prefect home of its own, the project's server settings."""
    home.mkdir(parents=True, exist_ok=True)
    env = os.environ | SERVER_SETTINGS | {"PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    return env


@contextmanager
def prefect_server(tmp: Path) -> Iterator[str]:
    """`prefect server start` with its home and log under `tmp`, until the block ends: its API
    URL (…/api), once it answers its health check."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api_url = f"http://127.0.0.1:{port}/api"
    argv = [sys.executable, "-m", "prefect", "server", "start"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    log = tmp / "prefect-server.log"
    with running(argv, server_environment(tmp / "prefect-server"), log) as process:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(api_url):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        yield api_url
