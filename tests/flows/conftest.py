"""Fixtures of the flow tests: one Prefect test harness for the session, the shared embedded
Whitney server (tests/conftest.py) with its key in WHITNEY_API_KEY, a check that the CLI
refuses a bad config, a terminal wide enough for the CLI's tables, a small config, and one
RL run of it with a checkpoint and an inline evaluation after each cycle, for the tests that
read a trained run's checkpoints or events; every test builds its flows' plans anew.

This directory has no __init__.py on purpose: test modules import as top-level names, so
helper modules here use names that cannot shadow a package (`flowtest_*`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from flowtest_cli import Refusal, assert_refused_before_any_session
from flowtest_helpers import CheckpointedRun
from flowtest_rl import small_rl_config
from prefect.testing.utilities import prefect_test_harness

from flows.core.loop.plans import forget_plans
from flows.rl.config import RLConfig
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


@pytest.fixture(autouse=True)
def fresh_plans() -> None:
    """Each test builds its flows' plans anew: some change a registry a plan reads (the
    recipes, a plug-in environment) for one test (flows.core.loop.plans)."""
    forget_plans()


@pytest.fixture(scope="session", autouse=True)
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect API (SQLite) for every flow test: it takes seconds to start."""
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def whitney(embedded_server: EmbeddedWhitney, monkeypatch: pytest.MonkeyPatch) -> EmbeddedWhitney:
    """The shared embedded server, its key where flows and hooks look for it."""
    monkeypatch.setenv("WHITNEY_API_KEY", embedded_server.api_key)
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    return embedded_server


@pytest.fixture
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """COLUMNS=250, so that the CLI's tables and summaries print without wrapping."""
    monkeypatch.setenv("COLUMNS", "250")


@pytest.fixture
def inspector(whitney: EmbeddedWhitney) -> Iterator[WhitneyClient]:
    """A client to check on the server what the flows left behind."""
    with WhitneyClient(whitney.url, whitney.api_key, backoff_base=0.01) as client:
        yield client


@pytest.fixture
def refused(
    whitney: EmbeddedWhitney, inspector: WhitneyClient, capsys: pytest.CaptureFixture[str]
) -> Refusal:
    """Checks that `whitney-flows run FLOW` on the shared server refuses a bad config
    (`flowtest_cli.assert_refused_before_any_session`)."""
    return functools.partial(assert_refused_before_any_session, whitney.url, inspector, capsys)


@pytest.fixture
def small_config(whitney: EmbeddedWhitney) -> RLConfig:
    """`small_rl_config` on the shared server."""
    return small_rl_config(whitney.url)


@pytest.fixture(scope="session")
def checkpointed_run(embedded_server: EmbeddedWhitney) -> CheckpointedRun:
    """The small config with `checkpoint_every` 1 and `eval_every` 1, trained once for the
    session: three checkpoints, each evaluated inline by the cycle that saved it."""
    from flows.core.records import events
    from flows.rl.flow import rl_flow

    emitted: list[dict[str, Any]] = []
    real = events.emit_event

    def record(event: str, **options: Any) -> Any:
        emitted.append({"event": event, **options})
        return real(event, **options)

    config = small_rl_config(embedded_server.url).model_copy(
        update={"checkpoint_every": 1, "eval_every": 1}
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WHITNEY_API_KEY", embedded_server.api_key)
        patch.delenv("WHITNEY_API_URL", raising=False)
        patch.setattr(events, "emit_event", record)
        state = rl_flow(config, return_state=True)
    return CheckpointedRun(config, state.result(), state.state_details.flow_run_id, emitted)
