"""`ride_out` (flows.core.orchestration.orchestrator) against a real HTTP health endpoint on
loopback: a
call that fails while the Prefect API does not answer waits for it and is made again, with
one line when Prefect goes and one when it is back; a failure while the API answers is the
call's own; past the bound, PrefectAway (an infrastructure error for the automatic resume).
The end-to-end outage (a real Prefect server SIGKILLed and restarted under a deployed run) is
tests/e2e/test_resume.py."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.core.orchestration import orchestrator
from flows.core.orchestration.orchestrator import (
    OUTAGE_ENV,
    PrefectAway,
    PrefectAwayNotice,
    prefect_away_notice,
    ride_out,
)
from flows.resume.continuation import resume_reason
from tests.e2e.harness import free_port


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def api_port() -> Iterator[int]:
    port = free_port()
    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        yield port


def serve(port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_call_that_fails_while_prefect_is_away_waits_for_it_and_is_made_again(
    api_port: int,
) -> None:
    said: list[str] = []
    away = threading.Event()
    calls: list[int] = []
    servers: list[ThreadingHTTPServer] = []
    # the API comes back once the flow has said it is away
    threading.Thread(target=lambda: away.wait(30) and servers.append(serve(api_port))).start()

    def create_subflow() -> str:
        calls.append(1)
        if len(calls) == 1:  # what create_flow_run meets while the server is down
            httpx.post(f"http://127.0.0.1:{api_port}/api/flow_runs/", timeout=2)
        return "cycle-3"

    try:
        with prefect_away_notice(lambda line: (said.append(line), away.set())) as notice:
            assert ride_out(create_subflow, notice, "cycle 3") == "cycle-3"
    finally:
        for server in servers:
            server.shutdown()
    assert len(calls) == 2
    assert len(said) == 2
    assert said[0].startswith(f"Prefect is away (http://127.0.0.1:{api_port}/api: cycle 3: ")
    assert "ConnectError" in said[0]
    assert said[1].startswith("Prefect is back after ")


def test_a_failure_while_prefect_answers_is_the_calls_own(api_port: int) -> None:
    server = serve(api_port)
    said: list[str] = []
    calls: list[int] = []

    def failing_cycle() -> None:
        calls.append(1)
        raise ValueError("the cycle's own error")

    try:
        with pytest.raises(ValueError, match="the cycle's own error"):
            ride_out(failing_cycle, PrefectAwayNotice(said.append), "cycle 1")
    finally:
        server.shutdown()
    assert calls == [1] and said == []


def test_past_the_bound_the_run_fails_with_an_infrastructure_error(
    api_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OUTAGE_ENV, "0")

    def create_subflow() -> None:
        httpx.post(f"http://127.0.0.1:{api_port}/api/flow_runs/", timeout=2)

    with (
        prefect_away_notice(lambda line: None) as notice,
        pytest.raises(PrefectAway, match=OUTAGE_ENV) as raised,
    ):
        ride_out(create_subflow, notice, "cycle 2")
    assert logging.raiseExceptions is True
    message = f"Flow run encountered an exception: PrefectAway: {raised.value}"
    assert resume_reason("FAILED", message) == "infrastructure:PrefectAway"


def test_a_subflows_connect_error_to_the_api_is_part_of_the_notice_not_a_traceback(
    api_port: int,
) -> None:
    said: list[str] = []
    flow_runs = logging.getLogger("prefect.flow_runs")
    with prefect_away_notice(said.append) as notice:
        try:
            httpx.post(f"http://127.0.0.1:{api_port}/api/flow_runs/", timeout=2)
        except httpx.ConnectError as error:
            flow_runs.exception("Encountered exception during execution: %r", error)
        try:
            httpx.get(f"http://127.0.0.1:{free_port()}/whitney", timeout=2)
        except httpx.ConnectError as error:  # not the Prefect API: shown as it is
            assert (
                notice.filter(
                    logging.makeLogRecord(
                        {"levelno": 40, "exc_info": (type(error), error, error.__traceback__)}
                    )
                )
                is True
            )
        assert logging.raiseExceptions is False  # the log shipper's own error lines
    assert logging.raiseExceptions is True
    assert len(said) == 1 and said[0].startswith("Prefect is away (")
    assert "Encountered exception during execution: ConnectError" in said[0]


def test_a_health_watch_says_prefect_is_away_and_back_while_nothing_fails(
    api_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a cycle runs, Prefect's clients may be retrying silently: the watch says it."""
    monkeypatch.setattr(orchestrator, "WATCH_S", 0.2)
    said: list[str] = []
    spoke = threading.Condition()

    def say(line: str) -> None:
        with spoke:
            said.append(line)
            spoke.notify_all()

    with prefect_away_notice(say):
        with spoke:
            assert spoke.wait_for(lambda: len(said) == 1, timeout=30)
        server = serve(api_port)
        try:
            with spoke:
                assert spoke.wait_for(lambda: len(said) == 2, timeout=30)
        finally:
            server.shutdown()
    assert said[0].startswith("Prefect is away (") and "no answer to its health check" in said[0]
    assert said[1].startswith("Prefect is back after ")
