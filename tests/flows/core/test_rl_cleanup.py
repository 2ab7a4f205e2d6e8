"""Nothing stays allocated: a flow that fails mid-run, one stopped by SIGTERM, and one whose
cancellation is requested each leave their sessions closed and their runs cancelled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from flowtest_helpers import assert_released, cancel_and_join, flow_run_sessions
from prefect.settings import PREFECT_API_URL

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from tasks.names import FLOW_RUN_LABEL
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def metrics_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def only_flow_run_id(client: WhitneyClient) -> str:
    """The flow run id labelling the one session on a fresh server."""
    (session,) = client.list_sessions()
    return session.labels[FLOW_RUN_LABEL]


@pytest.fixture
def fresh_server(whitney: EmbeddedWhitney, monkeypatch: pytest.MonkeyPatch):
    """A server of its own, so every session on it belongs to the test's flow run (its key
    replaces the shared server's)."""
    with EmbeddedWhitney() as server, WhitneyClient(server.url, server.api_key) as client:
        monkeypatch.setenv("WHITNEY_API_KEY", server.api_key)
        yield server, client


def test_failed_flow_cancels_its_run_and_closes_its_session(
    small_config: RLConfig, inspector: WhitneyClient
) -> None:
    config = small_config.model_copy(
        update={"env": "flowtest_plugins:BrokenAtCycle1", "cycles": 4, "cycle_retries": 0}
    )
    state = rl_flow(config, return_state=True)
    assert state.is_failed()
    (run,) = assert_released(inspector, state.state_details.flow_run_id)
    assert run.step == 1  # cycle 0 trained, cycle 1 failed before its forward_backward


def test_sigterm_crashes_the_flow_and_the_hook_releases_everything(
    fresh_server: tuple[EmbeddedWhitney, WhitneyClient], tmp_path: Path
) -> None:
    server, client = fresh_server
    metrics = tmp_path / "metrics.jsonl"
    command = [sys.executable, "-m", "flows.cli.main", "run", "rl", "--api-url", server.url]
    command += ["--base-model", "local/nano", "--cycles", "500", "--metrics-out", str(metrics)]
    environment = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    process = subprocess.Popen(
        command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: metrics_lines(metrics) >= 1, 120, "the first cycle")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0, output.decode(errors="replace")
    runs = assert_released(client, only_flow_run_id(client))
    assert len(runs) == 1


def test_requested_cancellation_stops_the_flow_and_releases_everything(
    fresh_server: tuple[EmbeddedWhitney, WhitneyClient], small_config: RLConfig, tmp_path: Path
) -> None:
    server, client = fresh_server
    metrics = tmp_path / "metrics.jsonl"
    config = small_config.model_copy(
        update={"api_url": server.url, "cycles": 500, "metrics_path": str(metrics)}
    )
    states = []
    flow_thread = threading.Thread(
        target=lambda: states.append(rl_flow(config, return_state=True)), daemon=True
    )
    flow_thread.start()
    wait_for(lambda: metrics_lines(metrics) >= 1, 120, "the first cycle")
    flow_run_id = only_flow_run_id(client)
    cancel_and_join(flow_run_id, flow_thread, states)
    assert metrics_lines(metrics) < 500
    assert_released(client, flow_run_id)
    assert len(flow_run_sessions(client, flow_run_id)) == 1
