"""Nothing `whitney-flows run` starts outlives it: the ephemeral Prefect server it starts (a
child process) ends with it whether it is interrupted (SIGINT), terminated (SIGTERM, which
runs no Python cleanup) or killed (SIGKILL), checked by PID. The embedded Whitney server is
a thread of the CLI's own process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flowtest_cli import CONSOLE_SCRIPT

PREFECT_SERVER_MARK = "prefect.server.api.server:create_app"
START_TIMEOUT_S = 240.0
GONE_WITHIN_S = 10.0
"""The watchdog looks every 0.2 s and gives SIGTERM 5 s before SIGKILL."""


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One PREFECT_HOME for the module: only the first start creates its database."""
    return tmp_path_factory.mktemp("prefect-home")


def children(pid: int) -> Iterator[tuple[int, str]]:
    """(pid, command line) of each live child of `pid` (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid:
            yield int(entry.name), cmdline


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status").read_text()
    return "\nState:\tZ" not in status


def prefect_server_of(cli: subprocess.Popen[str]) -> int:
    """The PID of the ephemeral Prefect server the CLI started, once it serves."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert cli.poll() is None, f"the CLI exited {cli.returncode}"
        servers = [pid for pid, cmdline in children(cli.pid) if PREFECT_SERVER_MARK in cmdline]
        watchdogs = [pid for pid, cmdline in children(cli.pid) if "flows.cli.watchdog" in cmdline]
        if servers and watchdogs:  # the watchdog is started once the server answers
            return servers[0]
        time.sleep(0.2)
    raise AssertionError("the CLI started no Prefect server")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_the_prefect_server_the_cli_started_ends_with_it(
    stop: signal.Signals, prefect_home: Path, tmp_path: Path
) -> None:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("WHITNEY_API_", "PREFECT_API_"))
    }
    environment |= {"PREFECT_HOME": str(prefect_home), "XDG_DATA_HOME": str(tmp_path)}
    with (tmp_path / "cli.log").open("w") as log:
        cli = subprocess.Popen(
            [str(CONSOLE_SCRIPT), "run", "rl", "--cycles", "500"],
            cwd=tmp_path,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        server = prefect_server_of(cli)
        cli.send_signal(stop)
        cli.wait(60)
        deadline = time.monotonic() + GONE_WITHIN_S
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(server), f"Prefect server {server} outlived the CLI ({stop.name})"
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
