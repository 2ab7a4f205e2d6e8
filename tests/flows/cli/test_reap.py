"""`whitney-flows reap` and the `reap` flow, on the shared embedded server and the test
harness's Prefect API: the sessions of Completed, Failed, Crashed and deleted flow runs are
listed by the dry run and closed (their runs cancelled) by --apply; a Running flow run's
session and an unlabelled one are kept; a bad URL is one line and exit code 2."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest
from prefect import flow, get_client
from prefect.states import Completed, Crashed, Failed, Running, State

from flows.cli.main import main
from flows.core.orchestration.reaping import FlowRunState, Verdict, judge, reap
from flows.reap.flow import reap_orphaned_sessions
from tasks.names import FLOW_RUN_LABEL
from whitney import wire
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


@flow(name="reap-subject")
def subject() -> None:
    """Never run: its flow runs are created in the state a test needs."""


def flow_run_in(state: State | None) -> UUID:
    """A flow run of `subject` in `state`; None: created, then deleted (gone)."""
    with get_client(sync_client=True) as prefect:
        flow_run = prefect.create_flow_run(subject, state=state or Completed())
        if state is None:
            prefect.delete_flow_run(flow_run.id)
    return flow_run.id


def labelled_session(client: WhitneyClient, flow_run_id: UUID | None) -> str:
    """An open session labelled with `flow_run_id` (None: unlabelled), holding a ready run."""
    labels = {} if flow_run_id is None else {FLOW_RUN_LABEL: str(flow_run_id)}
    session = client.open_session(labels=labels)
    client.create_run(session.session_id, "local", "local/nano", lora_rank=4, seed=3)
    return session.session_id


@pytest.fixture
def sessions(inspector: WhitneyClient) -> Iterator[dict[str, tuple[str, str]]]:
    """name: (session id, flow run id or "") for each kind of flow run, and an unlabelled
    session; every one still open is closed afterwards."""
    states = {
        "completed": Completed(),
        "failed": Failed(),
        "crashed": Crashed(),
        "running": Running(),
        "gone": None,
    }
    made = {}
    for name, state in states.items():
        flow_run_id = flow_run_in(state)
        made[name] = (labelled_session(inspector, flow_run_id), str(flow_run_id))
    made["unlabelled"] = (labelled_session(inspector, None), "")
    yield made
    for session_id, _ in made.values():
        if inspector.get_session(session_id).status != "closed":
            inspector.close_session(session_id)


def status(client: WhitneyClient, session_id: str) -> tuple[str, list[str]]:
    """The session's status and its runs' statuses."""
    session = client.get_session(session_id)
    return session.status, [client.get_run(run).status for run in session.run_ids or []]


def session(session_id: str, state: str, labels: dict[str, str]) -> wire.Session:
    return wire.Session(
        session_id=session_id, status=state, labels=labels, created_at="2026-01-01T00:00:00Z"
    )


REAPED = ("completed", "failed", "crashed", "gone")


def test_judge_closes_terminal_and_gone_flow_runs_and_looks_at_labelled_open_sessions() -> None:
    ids = {name: uuid4() for name in ("done", "running", "paused", "gone", "closed")}
    sessions = [
        session(name, "closed" if name == "closed" else "open", {FLOW_RUN_LABEL: str(id_)})
        for name, id_ in ids.items()
    ]
    sessions += [
        session("unlabelled", "open", {}),
        session("not-an-id", "open", {FLOW_RUN_LABEL: "x"}),
    ]
    states = {
        ids["done"]: FlowRunState("CANCELLED", "Cancelled"),
        ids["running"]: FlowRunState("RUNNING", "Retrying"),
        ids["paused"]: FlowRunState("PAUSED", "Suspended"),
    }
    verdicts = {v.session_id: (v.state, v.action) for v in judge(sessions, states)}
    assert verdicts == {
        "done": ("Cancelled", "close"),
        "running": ("Retrying", "keep"),
        "paused": ("Suspended", "keep"),
        "gone": ("gone", "close"),
    }


def test_the_dry_run_lists_and_apply_closes(
    sessions: dict[str, tuple[str, str]],
    inspector: WhitneyClient,
    whitney: EmbeddedWhitney,
    wide_terminal: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = whitney.url
    assert main(["reap", "--api-url", url]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if "sess-" in line}
    expected_state = {"completed": "Completed", "failed": "Failed", "crashed": "Crashed"}
    for name in REAPED:
        session_id, flow_run_id = sessions[name]
        assert lines[session_id] == [flow_run_id, expected_state.get(name, "gone"), "close"]
        assert status(inspector, session_id) == ("open", ["ready"])
    session_id, flow_run_id = sessions["running"]
    assert lines[session_id] == [flow_run_id, "Running", "keep"]
    assert sessions["unlabelled"][0] not in out
    assert "dry run: pass --apply to close" in out

    assert main(["reap", "--api-url", url, "--apply", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    actions = {row["session_id"]: row["action"] for row in report["sessions"]}
    assert report["applied"] is True and report["failed"] == 0
    for name in REAPED:
        assert actions[sessions[name][0]] == "closed"
        assert status(inspector, sessions[name][0]) == ("closed", ["cancelled"])
    assert actions[sessions["running"][0]] == "keep"
    for name in ("running", "unlabelled"):
        assert status(inspector, sessions[name][0]) == ("open", ["ready"])


def test_the_flow_closes_only_with_apply(
    sessions: dict[str, tuple[str, str]], inspector: WhitneyClient, whitney: EmbeddedWhitney
) -> None:
    rows = reap_orphaned_sessions(api_url=whitney.url)
    completed = sessions["completed"][0]
    assert {row["session_id"]: row["action"] for row in rows}[completed] == "close"
    assert status(inspector, completed)[0] == "open"
    rows = reap_orphaned_sessions(apply=True, api_url=whitney.url)
    actions = {row["session_id"]: row["action"] for row in rows}
    assert [actions[sessions[name][0]] for name in (*REAPED, "running")] == [
        "closed",
        "closed",
        "closed",
        "closed",
        "keep",
    ]
    assert status(inspector, completed)[0] == "closed"
    assert status(inspector, sessions["running"][0])[0] == "open"


def test_a_flow_run_running_again_by_the_time_of_apply_is_kept(
    sessions: dict[str, tuple[str, str]], inspector: WhitneyClient
) -> None:
    session_id, flow_run_id = sessions["running"]  # as if retried since the survey
    surveyed = Verdict(session_id, flow_run_id, "Failed", "close")
    (verdict,) = reap(inspector, [surveyed], logging.getLogger(__name__))
    assert (verdict.state, verdict.action) == ("Running", "keep")
    assert status(inspector, session_id) == ("open", ["ready"])


def test_a_bad_url_is_one_line_and_exit_2(
    whitney: EmbeddedWhitney, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    assert main(["reap", "--api-url", url]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"whitney-flows reap: --api-url: no Whitney answers at {url} "
        "(ConnectError: [Errno 111] Connection refused)\n"
    )
    assert main(["reap"]) == 2
    assert capsys.readouterr().err == (
        "whitney-flows reap: --api-url: no Whitney URL: give --api-url or set WHITNEY_API_URL\n"
    )
