"""promote-checkpoint on the harness's Prefect API: "the best checkpoint of run X by metric M"
is the one a hand argmax over the run's inline evaluations picks, each candidate's numbers are
its cycle's; the run pauses with nothing open on Whitney and goes on when the test submits the
form through the call the UI's Resume form makes (`POST /flow_runs/{id}/resume` with
`run_input`); rejected, it ends cleanly with the decision recorded and nothing exported. A used
target directory is refused before anything is allocated; with no answer within
approval_timeout_s the outcome is recorded and the run fails (Prefect fails a pause that
times out). (Approval and the export: the e2e test, tests/e2e/test_checkpoints.py.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from flowtest_helpers import CheckpointedRun, artifacts_of, flow_run_sessions
from prefect import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_URL

from flows.checkpoints.config import PromoteConfig
from flows.checkpoints.promote import promote_checkpoint
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

PAUSE_DEADLINE_S = 120


class Promotion(threading.Thread):
    """promote_checkpoint(config) in a thread (it blocks while paused); its final state."""

    def __init__(self, config: PromoteConfig) -> None:
        super().__init__(daemon=True)
        self.config = config
        self.state: Any = None

    def run(self) -> None:
        self.state = promote_checkpoint(self.config, return_state=True)


def paused_run() -> Any:
    """The promote-checkpoint flow run that is Paused (bounded wait)."""
    deadline = time.monotonic() + PAUSE_DEADLINE_S
    with get_client(sync_client=True) as prefect:
        while time.monotonic() < deadline:
            runs = prefect.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["promote-checkpoint"])),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))
                ),
            )
            if runs:
                return runs[0]
            time.sleep(0.5)
    raise AssertionError("no promote-checkpoint flow run paused")


def call(http: httpx.Client, method: str, path: str, **options: Any) -> Any:
    """One API call; a SQLite "database is locked" 503 is tried again, as the UI's client does."""
    for _ in range(10):
        answer = http.request(method, path, **options)
        if answer.status_code != 503:
            break
        time.sleep(1)
    answer.raise_for_status()
    return answer.json()


def resume_as_the_ui_does(flow_run: Any, approve: bool, note: str) -> dict[str, Any]:
    """The Resume form's calls: its description and schema (what it shows), then the
    submission, `POST /flow_runs/{id}/resume {"run_input": ...}`; the orchestration answer."""
    keyset = flow_run.state.state_details.run_input_keyset
    with httpx.Client(base_url=PREFECT_API_URL.value(), timeout=30) as http:
        description = call(http, "GET", f"/flow_runs/{flow_run.id}/input/{keyset['description']}")
        schema = call(http, "GET", f"/flow_runs/{flow_run.id}/input/{keyset['schema']}")
        assert {"approve", "note"} <= set(schema["properties"]), schema
        assert "Promote" in description
        run_input = {"approve": approve, "note": note}
        return call(http, "POST", f"/flow_runs/{flow_run.id}/resume", json={"run_input": run_input})


def test_promotion_waits_with_nothing_open_and_a_rejection_ends_it_cleanly(
    whitney: EmbeddedWhitney,
    checkpointed_run: CheckpointedRun,
    inspector: WhitneyClient,
    tmp_path: Path,
) -> None:
    config, trained = checkpointed_run.config, checkpointed_run.result
    target = tmp_path / "never"
    promotion = Promotion(
        PromoteConfig(
            api_url=whitney.url,
            evaluation=config.eval_settings(),
            run_id=trained.run_id,
            target_dir=str(target),
        )
    )
    promotion.start()
    flow_run = paused_run()
    sessions = flow_run_sessions(inspector, flow_run.id)
    assert sessions and {session.status for session in sessions} == {"closed"}
    assert resume_as_the_ui_does(flow_run, False, "not yet")["status"] == "ACCEPT"
    promotion.join(timeout=300)
    assert promotion.state.is_completed(), promotion.state
    result = promotion.state.result()
    assert (result.approved, result.note, result.target_dir) == (False, "not yet", None)
    # the best of the run's three checkpoints by reward_mean: a hand argmax over the inline
    # evaluations of the cycles that saved them (the earliest of equals)
    rewards = [cycle.eval.reward_mean for cycle in trained.cycles]
    best = rewards.index(max(rewards))
    assert result.checkpoint == f"whitney://runs/{trained.run_id}/states/cycle-{best}"
    assert [candidate.cycle for candidate in result.candidates] == [0, 1, 2]
    for candidate, cycle in zip(result.candidates, trained.cycles, strict=True):
        exclude = {"seconds"}
        assert candidate.evaluation.model_dump(exclude=exclude) == cycle.eval.model_dump(
            exclude=exclude
        )
    texts = [artifact.data for artifact in artifacts_of(flow_run.id)]
    assert any(text.startswith("**Promote") and "(chosen)" in text for text in texts)
    assert any("Rejected" in text and "not yet" in text for text in texts)
    assert not target.exists()
    assert {session.status for session in flow_run_sessions(inspector, flow_run.id)} == {"closed"}

    # nobody answers within approval_timeout_s: recorded, nothing exported, the run fails
    unanswered = PromoteConfig(
        api_url=whitney.url,
        evaluation=config.eval_settings(),
        checkpoint=trained.checkpoint,
        target_dir=str(target),
        approval_timeout_s=2,
    )
    state = promote_checkpoint(unanswered, return_state=True)
    assert state.is_failed()
    texts = [artifact.data for artifact in artifacts_of(state.state_details.flow_run_id)]
    assert any("Rejected" in text and "no decision within 2 s" in text for text in texts)
    assert not target.exists()


def test_a_used_target_directory_is_refused_before_anything(
    whitney: EmbeddedWhitney, inspector: WhitneyClient, tmp_path: Path
) -> None:
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "config.json").write_text("{}")
    config = PromoteConfig(
        api_url=whitney.url,
        checkpoint="whitney://runs/run-x/states/cycle-0",
        target_dir=str(tmp_path),
    )
    state = promote_checkpoint(config, return_state=True)
    with pytest.raises(Exception, match="target_dir: .*merged exists and is not an empty"):
        state.result()
    assert flow_run_sessions(inspector, state.state_details.flow_run_id) == []
