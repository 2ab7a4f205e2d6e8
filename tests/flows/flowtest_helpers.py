"""Checks the flow tests make on the Whitney server and the Prefect API."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import pytest
from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import Artifact, FlowRun, TaskRun
from prefect.states import Cancelling, State

from flows.rl.config import RLConfig
from flows.rl.metrics import RLResult
from tasks.names import FLOW_RUN_LABEL
from tests.local.helpers import journal_rows
from whitney import wire
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


@dataclass(frozen=True)
class CheckpointedRun:
    """A trained RL run (its config, result and flow run) and every event emitted meanwhile."""

    config: RLConfig
    result: RLResult
    flow_run_id: UUID
    events: list[dict[str, Any]]


def assert_executed_once_in_order(server: EmbeddedWhitney, run_id: str) -> list[dict]:
    """Every seq id of the run, 1..N without a gap, executed exactly once."""
    rows = journal_rows(server, run_id)
    assert [row["seq_id"] for row in rows] == list(range(1, len(rows) + 1))
    assert [row["executions"] for row in rows] == [1] * len(rows)
    assert {row["status"] for row in rows} == {"succeeded"}
    return rows


def flow_run_sessions(client: WhitneyClient, flow_run_id: UUID | str) -> list[wire.Session]:
    return client.list_sessions(label=f"{FLOW_RUN_LABEL}:{flow_run_id}")


def assert_released(client: WhitneyClient, flow_run_id: UUID | str) -> list[wire.Run]:
    """The flow run's sessions exist, are all closed, and their runs are all cancelled."""
    sessions = flow_run_sessions(client, flow_run_id)
    assert sessions, f"no session bears the label of flow run {flow_run_id}"
    runs = []
    for session in sessions:
        assert client.get_session(session.session_id).status == "closed"
        for run_id in client.get_session(session.session_id).run_ids or []:
            runs.append(client.get_run(run_id))
    assert runs
    assert {run.status for run in runs} == {"cancelled"}
    return runs


def assert_finished(client: WhitneyClient, session_id: str) -> list[wire.Run]:
    """The session is closed and its runs are all finished; its runs."""
    session = client.get_session(session_id)
    assert session.status == "closed"
    runs = [client.get_run(run_id) for run_id in session.run_ids or []]
    assert {run.status for run in runs} == {"finished"}
    return runs


def subflow_runs(flow_run_id: UUID) -> list[FlowRun]:
    with get_client(sync_client=True) as prefect:
        runs = prefect.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
            )
        )
    return sorted(runs, key=lambda run: run.expected_start_time or run.created)


def task_runs_of(flow_run_id: UUID, expected: int, timeout_s: float = 20.0) -> list[TaskRun]:
    """The flow run's task runs, once at least `expected` are recorded (events are async)."""
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as prefect:
        while True:
            runs = prefect.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            if len(runs) >= expected or time.monotonic() > deadline:
                return runs
            time.sleep(0.2)


def artifacts_of(flow_run_id: UUID) -> list[Artifact]:
    """The artifacts of one flow run."""
    with get_client(sync_client=True) as prefect:
        return prefect.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )


def cycle_artifact(flow_run_id: UUID) -> tuple[str, dict[str, str]]:
    """A cycle subflow run's one artifact: its markdown, and the rows of its metrics table."""
    (artifact,) = artifacts_of(flow_run_id)
    assert artifact.type == "markdown"
    metrics = artifact.data.split("## Metrics", 1)[1].split("## Operations", 1)[0]
    return artifact.data, dict(re.findall(r"^\| (\w+) \| ([^|]*) \|$", metrics, re.MULTILINE))


def hold_first_forward_backward(
    monkeypatch: pytest.MonkeyPatch, behind: int
) -> list[tuple[int, bool]]:
    """Hold the process's first forward_backward back until the `behind` operations after it
    (the next seq ids) are on their way, at most 60 s: only a block submitted before any
    answer lets them through. Appends (its seq id, whether they all came) to the list it
    returns."""
    execute = WhitneyClient.execute
    entered: dict[int, threading.Event] = {}
    lock = threading.Lock()
    held: list[tuple[int, bool]] = []

    def event(seq_id: int) -> threading.Event:
        with lock:
            return entered.setdefault(seq_id, threading.Event())

    def spying_execute(self, run_id, kind, payload, *, seq_id=None, **options):
        if seq_id is not None:
            event(seq_id).set()
        if kind == "forward_backward" and not held:
            waits = [event(seq_id + offset) for offset in range(1, behind + 1)]
            held.append((seq_id, all(e.wait(timeout=60) for e in waits)))
        return execute(self, run_id, kind, payload, seq_id=seq_id, **options)

    monkeypatch.setattr(WhitneyClient, "execute", spying_execute)
    return held


def cancel_and_join(flow_run_id: str, flow: threading.Thread, states: list[State]) -> State:
    """Ask Prefect to cancel the flow run that the thread `flow` runs, and wait for the thread;
    the flow's final state (in `states`), which must be cancelling or cancelled."""
    with get_client(sync_client=True) as prefect:
        prefect.set_flow_run_state(flow_run_id, Cancelling(message="requested by the test"))
    flow.join(timeout=120)
    assert not flow.is_alive()
    (state,) = states
    assert state.is_cancelling() or state.is_cancelled(), state
    return state
