"""`whitney-flows run FLOW` checks the Whitney URL and key before Prefect starts: a refused
connection, a silent server or a refused key is one line naming --api-url (or WHITNEY_API_URL)
or WHITNEY_API_KEY, exit code 2, within 5 s, and no session is opened. The console script gives
the line and the code as a user sees them; the 5 s are timed around `main` in this process, so
that they count the check's own waiting, not a loaded machine's interpreter start and imports
(15 s under CI's load)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flowtest_cli import CONSOLE_SCRIPT

from flows.cli.main import main
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

DEADLINE_S = 5.0
MARGIN = 2.0
"""The deadline is checked with this factor of slack: the test machine is shared."""


def endpoint_variable(name: str) -> bool:
    """A variable that names a Whitney or Prefect to reach: each test sets its own."""
    return name.startswith("WHITNEY_API_") or name == "PREFECT_API_URL"


def run_script(*arguments: str, **variables: str) -> tuple[int, str, str]:
    """The console script as a user runs it, without any WHITNEY_API_* variable but
    `variables`: (exit code, stdout, stderr)."""
    environment = {k: v for k, v in os.environ.items() if not endpoint_variable(k)}
    completed = subprocess.run(
        [str(CONSOLE_SCRIPT), *arguments],
        env=environment | variables,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return completed.returncode, completed.stdout, completed.stderr


def seconds_to_refuse(monkeypatch: pytest.MonkeyPatch, *arguments: str, **variables: str) -> float:
    """How long `main` takes to refuse `arguments` (exit code 2) in this process, with only
    `variables` of the WHITNEY_API_* ones set."""
    for name in [k for k in os.environ if endpoint_variable(k)]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    assert main(list(arguments)) == 2
    return time.monotonic() - started


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("flow", ["rl", "sft", "distill"])
def test_a_refused_connection_is_one_line_and_exit_2_within_5_s(
    flow: str,
    closed_port: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The console script for rl (the same `main` serves every flow); each flow's line and
    code in this process."""
    url = f"http://127.0.0.1:{closed_port}"
    line = (
        f"whitney-flows run {flow}: --api-url: no Whitney answers at {url} "
        "(ConnectError: [Errno 111] Connection refused)\n"
    )
    if flow == "rl":
        code, out, err = run_script("run", flow, "--api-url", url, WHITNEY_API_KEY="k-1234")
        assert (code, out, err) == (2, "", line)
    capsys.readouterr()
    elapsed = seconds_to_refuse(
        monkeypatch, "run", flow, "--api-url", url, WHITNEY_API_KEY="k-1234"
    )
    assert capsys.readouterr() == ("", line)
    assert elapsed < DEADLINE_S * MARGIN, elapsed


def test_a_silent_server_is_one_line_and_exit_2_within_5_s(
    silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{silent_port}"
    code, out, err = run_script("run", "rl", "--api-url", url, WHITNEY_API_KEY="k-1234")
    assert (code, out) == (2, "")
    reason = "ReadTimeout: timed out"
    assert err == f"whitney-flows run rl: --api-url: no Whitney answers at {url} ({reason})\n"
    elapsed = seconds_to_refuse(
        monkeypatch, "run", "rl", "--api-url", url, WHITNEY_API_KEY="k-1234"
    )
    assert elapsed < DEADLINE_S * MARGIN, elapsed


def test_a_refused_key_is_one_line_naming_whitney_api_key(
    embedded_server: EmbeddedWhitney,
    whitney_client: WhitneyClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sessions = len(whitney_client.list_sessions())
    wrong_key = "not-the-key-0123456789"
    code, out, err = run_script(
        "run", "rl", WHITNEY_API_URL=embedded_server.url, WHITNEY_API_KEY=wrong_key
    )
    assert (code, out) == (2, "")
    assert err == (
        f"whitney-flows run rl: WHITNEY_API_KEY: {embedded_server.url} refused the key "
        "(401 unauthorized: invalid API key)\n"
    )
    assert wrong_key not in err
    elapsed = seconds_to_refuse(
        monkeypatch, "run", "rl", WHITNEY_API_URL=embedded_server.url, WHITNEY_API_KEY=wrong_key
    )
    assert elapsed < DEADLINE_S * MARGIN, elapsed
    assert len(whitney_client.list_sessions()) == sessions


def test_a_prefect_that_does_not_start_is_one_line_and_exit_1(tmp_path: Path) -> None:
    variables = {
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0",
    }
    code, out, err = run_script("run", "rl", "--cycles", "1", **variables)
    assert code == 1
    assert "Starting Prefect's ephemeral API server" in out
    assert err == (
        "whitney-flows run rl: Prefect did not start: Timed out while attempting to connect to"
        " ephemeral Prefect API server. (waited 0 s: raise"
        " PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or set PREFECT_API_URL to a running"
        " `prefect server start`)\n"
    )


def test_the_url_from_the_environment_is_named_as_such(
    closed_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    monkeypatch.setenv("WHITNEY_API_URL", url)
    monkeypatch.setenv("WHITNEY_API_KEY", "k-1234")
    assert main(["run", "sft", "--steps", "3"]) == 2
    assert capsys.readouterr().err.startswith(
        f"whitney-flows run sft: WHITNEY_API_URL: no Whitney answers at {url} ("
    )


def test_a_url_that_is_not_http_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WHITNEY_API_KEY", "k-1234")
    assert main(["run", "rl", "--api-url", "ftp://example.org"]) == 2
    assert capsys.readouterr().err == (
        "whitney-flows run rl: --api-url: base_url must be an http:// or https:// URL, "
        "got 'ftp://example.org'\n"
    )


@pytest.mark.parametrize(
    ("arguments", "variables", "named_by"),
    [
        (["--api-url", "http://127.0.0.1:9"], {}, "--api-url"),
        ([], {"WHITNEY_API_URL": "http://127.0.0.1:9"}, "WHITNEY_API_URL"),
    ],
)
def test_a_url_without_a_key_is_one_line_naming_where_the_url_came_from(
    arguments: list[str],
    variables: dict[str, str],
    named_by: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WHITNEY_API_KEY", raising=False)
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert main(["run", "rl", *arguments]) == 2
    assert capsys.readouterr().err == (
        f"whitney-flows run rl: {named_by}: reading http://127.0.0.1:9 needs WHITNEY_API_KEY\n"
    )
