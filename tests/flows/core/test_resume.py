"""Resume: a flow run that failed for good, retried with `prefect flow-run retry`, continues
on a new run from its latest `cycle-{n}` checkpoint and ends with the adapter of an undisturbed
run, bit for bit (optimizer state included); an in-process flow retry does the same;
`resume_from=<checkpoint>` does it across flow runs; checkpoints behind a failed operation are
not trusted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flowtest_helpers import assert_executed_once_in_order, assert_released, subflow_runs
from flowtest_resume_plugins import FAIL_AT_CYCLE_ENV, FAIL_MARKER_ENV, fail_once_at_cycle
from prefect import get_client
from prefect.settings import PREFECT_API_URL

from flows.core.config import ConfigError, check_resume_from, checkpoint_due
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.metrics import RLResult
from tasks.names import FLOW_RUN_LABEL
from tasks.resume import latest_checkpoints, run_checkpoints
from whitney import wire
from whitney.client import WhitneyClient
from whitney.errors import OperationFailed
from whitney.local import EmbeddedWhitney

REPO = Path(__file__).resolve().parents[3]
TESTS_FLOWS = Path(__file__).resolve().parents[1]


@pytest.fixture
def resumable(small_config: RLConfig) -> RLConfig:
    """7 cycles, a checkpoint every 2 (after cycles 1, 3 and 5; the final one is cycle-6),
    an environment that can be made to fail once, no cycle retries."""
    return small_config.model_copy(
        update={
            "cycles": 7,
            "checkpoint_every": 2,
            "env": "flowtest_resume_plugins:FailOnceAtCycle",
            "cycle_retries": 0,
        }
    )


_undisturbed: dict[str, RLResult] = {}


@pytest.fixture
def undisturbed(resumable: RLConfig) -> Iterator[RLResult]:
    """The undisturbed run of `resumable` (computed once per server and config)."""
    key = resumable.model_dump_json()
    if key not in _undisturbed:
        _undisturbed[key] = rl_flow(resumable)
    yield _undisturbed[key]


@pytest.fixture
def fail_once_at_cycle_5(
    undisturbed: RLResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Cycle 5 of the next flow run fails once (after the undisturbed run is computed)."""
    return fail_once_at_cycle(monkeypatch, 5, tmp_path)


def runs_of(client: WhitneyClient, flow_run_id: object) -> list[wire.Run]:
    """The flow run's Whitney runs, oldest first."""
    runs = [
        client.get_run(run_id)
        for session in client.list_sessions(label=f"{FLOW_RUN_LABEL}:{flow_run_id}")
        for run_id in client.get_session(session.session_id).run_ids or []
    ]
    return sorted(runs, key=lambda run: run.created_at)


def final_sha256(client: WhitneyClient, run_id: str) -> str:
    operations = client.journal(run_id, limit=1000)
    assert operations[-1].kind == "export_lora"
    return operations[-1].result["sha256"]


def test_checkpoint_schedule() -> None:
    due = [cycle for cycle in range(7) if checkpoint_due(cycle, 2, 7)]
    assert due == [1, 3, 5]  # cycle 6 is the last: the final save_state names it
    assert not any(checkpoint_due(cycle, 0, 7) for cycle in range(7))
    assert [cycle for cycle in range(6) if checkpoint_due(cycle, 3, 6)] == [2]


def test_resume_from_is_checked_before_anything_is_allocated(small_config: RLConfig) -> None:
    check_resume_from(None, 5)
    check_resume_from("whitney://runs/run-1/states/cycle-3", 5)
    with pytest.raises(ConfigError, match="nothing is left to train"):
        check_resume_from("whitney://runs/run-1/states/cycle-4", 5)
    with pytest.raises(ConfigError, match="resume_from"):
        check_resume_from("whitney://runs/run-1/states/seq-4", 5)
    with pytest.raises(ValueError, match="resume_from"):
        RLConfig(resume_from="whitney://runs/run-1/states/final")


def test_retried_flow_run_resumes_from_its_latest_checkpoint(
    whitney: EmbeddedWhitney,
    resumable: RLConfig,
    undisturbed: RLResult,
    inspector: WhitneyClient,
    fail_once_at_cycle_5: Path,
) -> None:
    state = rl_flow(resumable, return_state=True)
    assert state.is_failed()
    assert fail_once_at_cycle_5.exists()
    flow_run_id = state.state_details.flow_run_id
    (first,) = assert_released(inspector, flow_run_id)  # the hooks cancelled it
    assert run_checkpoints(inspector, first.run_id).keys() == {1, 3}

    # `prefect flow-run retry` of a run without a deployment executes it again locally, with
    # the same flow run id and parameters (run_count 2); nothing of the failure is set here
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in (FAIL_AT_CYCLE_ENV, FAIL_MARKER_ENV)
    }
    environment["PREFECT_API_URL"] = PREFECT_API_URL.value()
    environment["PYTHONPATH"] = os.pathsep.join([str(TESTS_FLOWS), str(REPO)])
    command = [sys.executable, "-m", "prefect", "flow-run", "retry", str(flow_run_id)]
    command += ["--entrypoint", "flows/rl/flow.py:rl_flow"]
    retry = subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600
    )
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert "completed successfully" in retry.stdout

    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(flow_run_id)
    assert flow_run.state is not None and flow_run.state.is_completed()
    assert flow_run.run_count == 2

    before, after = runs_of(inspector, flow_run_id)
    assert before.run_id == first.run_id and before.status == "cancelled"
    assert after.status == "finished"
    assert after.model_extra["from_checkpoint"] == (f"whitney://runs/{first.run_id}/states/cycle-3")
    assert after.step == resumable.cycles  # 4 steps restored, 3 trained
    operations = assert_executed_once_in_order(whitney, after.run_id)
    assert [row["kind"] for row in operations[:2]] == ["save_weights_for_sampler", "sample"]
    assert final_sha256(inspector, after.run_id) == undisturbed.adapter.sha256
    assert all(session.status == "closed" for session in inspector.list_sessions(
        label=f"{FLOW_RUN_LABEL}:{flow_run_id}"
    ))  # fmt: skip
    names = [run.name for run in subflow_runs(flow_run_id)]
    assert names[:6] == [f"cycle-{n}" for n in range(6)]  # the first attempt, failed at 5
    assert names[6:] == ["cycle-4", "cycle-5", "cycle-6"]  # the retry


@pytest.mark.usefixtures("fail_once_at_cycle_5")
def test_in_process_flow_retry_resumes_and_releases_the_earlier_run(
    resumable: RLConfig, undisturbed: RLResult, inspector: WhitneyClient
) -> None:
    """A flow with retries runs no failure hook between attempts: the retry itself releases
    the earlier attempt's run before resuming."""
    state = rl_flow.with_options(retries=1)(resumable, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result.adapter.sha256 == undisturbed.adapter.sha256
    earlier, resumed = runs_of(inspector, state.state_details.flow_run_id)
    assert earlier.status == "cancelled" and resumed.status == "finished"
    assert result.resumed_from == f"whitney://runs/{earlier.run_id}/states/cycle-3"
    assert [cycle.cycle for cycle in result.cycles] == [4, 5, 6]


_shorter: dict[str, RLResult] = {}


@pytest.fixture
def shorter(resumable: RLConfig, undisturbed: RLResult) -> RLResult:
    """A run of `resumable` cut to 4 cycles (checkpoints cycle-1, final cycle-3), once per
    server and config."""
    key = resumable.model_dump_json()
    if key not in _shorter:
        _shorter[key] = rl_flow(resumable.model_copy(update={"cycles": 4}))
    return _shorter[key]


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "unpipelined"])
def test_resume_from_a_checkpoint_of_another_flow_run(
    whitney: EmbeddedWhitney,
    resumable: RLConfig,
    undisturbed: RLResult,
    shorter: RLResult,
    pipelined: bool,
) -> None:
    for cycle in (1, 3):
        checkpoint = f"whitney://runs/{shorter.run_id}/states/cycle-{cycle}"
        config = resumable.model_copy(update={"resume_from": checkpoint, "pipelined": pipelined})
        resumed = rl_flow(config)
        assert resumed.resumed_from == checkpoint
        assert [metrics.cycle for metrics in resumed.cycles] == list(range(cycle + 1, 7))
        assert resumed.adapter.sha256 == undisturbed.adapter.sha256
        assert_executed_once_in_order(whitney, resumed.run_id)


def overflowing_forward() -> dict:
    """A forward whose loss overflows float32 (ratio e^20 times an advantage of 3e38): it is
    accepted, then fails `non_finite` when it runs."""
    tokens = {"dtype": "int64", "shape": [3], "values": [2, 3, 4]}
    inputs = {
        "target_tokens": tokens,
        "logprobs": {"dtype": "float32", "shape": [3], "values": [-100.0] * 3},
        "advantages": {"dtype": "float32", "shape": [3], "values": [3e38] * 3},
    }
    datum = {"input": {"token_ids": [1, 2, 3]}, "loss_inputs": inputs}
    return {"loss_function": "importance_sampling", "loss_config": {}, "data": [datum]}


def test_checkpoints_behind_a_failed_operation_are_not_trusted(
    inspector: WhitneyClient,
) -> None:
    session = inspector.open_session({FLOW_RUN_LABEL: "resume-unit-test"})
    run = inspector.create_run(session.session_id, "local", "local/nano", lora_rank=4, seed=3)
    inspector.run_operation(run.run_id, "save_weights_for_sampler", {}, seq_id=1)
    inspector.run_operation(run.run_id, "save_state", {"name": "cycle-0"}, seq_id=2)
    inspector.run_operation(run.run_id, "save_state", {"name": "other"}, seq_id=3)
    with pytest.raises(OperationFailed, match="non_finite"):  # journaled, failed in execution
        inspector.run_operation(run.run_id, "forward", overflowing_forward(), seq_id=4)
    inspector.run_operation(run.run_id, "save_state", {"name": "cycle-1"}, seq_id=5)

    assert run_checkpoints(inspector, run.run_id) == {
        0: f"whitney://runs/{run.run_id}/states/cycle-0"
    }
    found = latest_checkpoints(inspector, "resume-unit-test")
    assert found is not None
    assert (found.first_cycle, found.checkpoint) == (
        1,
        f"whitney://runs/{run.run_id}/states/cycle-0",
    )
    assert latest_checkpoints(inspector, "no-such-flow-run") is None
    inspector.close_session(session.session_id)


def test_a_critic_resumes_with_the_policy(
    whitney: EmbeddedWhitney,
    small_config: RLConfig,
    inspector: WhitneyClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PPO with a critic: the critic run checkpoints beside the policy and is created from its
    checkpoint on resume (its value head and optimizer included): the same adapter, by retry
    and by resume_from."""
    config = small_config.model_copy(
        update={
            "loss": "ppo_critic",
            "cycles": 5,
            "checkpoint_every": 2,
            "env": "flowtest_resume_plugins:FailOnceAtCycle",
            "cycle_retries": 0,
        }
    )
    undisturbed = rl_flow(config)

    fail_once_at_cycle(monkeypatch, 3, tmp_path)
    state = rl_flow.with_options(retries=1)(config, return_state=True)
    assert state.is_completed(), state.message
    retried = state.result()
    assert retried.adapter.sha256 == undisturbed.adapter.sha256
    runs = runs_of(inspector, state.state_details.flow_run_id)
    critics = [run for run in runs if run.role == "critic"]
    assert len(critics) == 2
    assert critics[1].model_extra["from_checkpoint"] == (
        f"whitney://runs/{critics[0].run_id}/states/cycle-1"
    )

    resumed = rl_flow(
        config.model_copy(
            update={"resume_from": f"whitney://runs/{undisturbed.run_id}/states/cycle-3"}
        )
    )
    assert [metrics.cycle for metrics in resumed.cycles] == [4]
    assert resumed.adapter.sha256 == undisturbed.adapter.sha256
