"""The SFT flow on the embedded server: its journal, records and learning-rate schedule; a
retried cycle replays exactly; resume_from continues exactly; a failure, also inside a parent
flow, leaves nothing open; a bad config opens nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from flowtest_helpers import (
    artifacts_of,
    assert_executed_once_in_order,
    assert_released,
    cycle_artifact,
    flow_run_sessions,
    hold_first_forward_backward,
    journal_rows,
    subflow_runs,
    task_runs_of,
)
from flowtest_sft import small_sft_config
from prefect import flow

from flows.core.config import ConfigError
from flows.sft.config import SFTConfig
from flows.sft.flow import sft_flow
from flows.sft.schedules import scheduled_rate
from tasks.operations import SequencedClient
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

STEP = ["forward_backward", "optim_step"]
CYCLE_KINDS = [
    ["forward", *STEP, *STEP, "forward", "save_state"],  # eval before training, eval at step 2
    [*STEP, *STEP, "forward", "save_state"],
    [*STEP, *STEP, "forward"],  # the last cycle: the final save_state keeps its state
]


def fail_once(monkeypatch: pytest.MonkeyPatch, kind: str, call: int, times: int = 1) -> list[int]:
    """Make SequencedClient.execute raise after the `call`-th operation of `kind` (and the
    next `times - 1` calls of it); the seq ids of every call of `kind`, in order."""
    execute = SequencedClient.execute
    calls: list[int] = []

    def failing(self, run_id, kind_, payload, **options):
        operation = execute(self, run_id, kind_, payload, **options)
        if kind_ == kind:
            calls.append(operation.seq_id)
            if call <= len(calls) < call + times:
                raise RuntimeError(f"injected: failure after {kind} call {len(calls)}")
        return operation

    monkeypatch.setattr(SequencedClient, "execute", failing)
    return calls


def test_journal_records_and_schedule(
    whitney: EmbeddedWhitney, inspector: WhitneyClient, tmp_path: Path
) -> None:
    metrics_path = tmp_path / "metrics.jsonl"
    config = small_sft_config(whitney.url, metrics_path=str(metrics_path), schedule="linear")
    state = sft_flow(config, return_state=True)
    result = state.result()

    rows = assert_executed_once_in_order(whitney, result.run_id)
    kinds = [row["kind"] for row in rows]
    assert kinds == [kind for cycle in CYCLE_KINDS for kind in cycle] + [
        "save_state",
        "export_lora",
    ]
    journal = inspector.journal(result.run_id, limit=100)
    rates = [op.result["metrics"]["learning_rate"] for op in journal if op.kind == "optim_step"]
    expected = [scheduled_rate("linear", config.learning_rate, step, 6, 1) for step in range(6)]
    assert rates == pytest.approx(expected)
    checkpoints = [op.result["checkpoint"] for op in journal if op.kind == "save_state"]
    prefix = f"whitney://runs/{result.run_id}/states/"
    assert checkpoints == [prefix + "cycle-0", prefix + "cycle-1", prefix + "cycle-2"]
    assert result.checkpoint == prefix + "cycle-2"

    assert result.steps == 6 and result.eval_steps == [0, 2, 4, 6]
    assert len(result.eval_losses) == 4 and all(loss > 0 for loss in result.eval_losses)
    evals = [op.result for op in journal if op.kind == "forward"]
    assert result.eval_losses[0] == pytest.approx(
        evals[0]["loss"] / evals[0]["metrics"]["tokens:sum"]
    )

    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    assert [line["cycle"] for line in lines] == [0, 1, 2]
    assert [line["step_end"] for line in lines] == [2, 4, 6]
    assert [line["checkpoint"] for line in lines] == [prefix + "cycle-0", prefix + "cycle-1", None]
    assert [[point["step"] for point in line["evals"]] for line in lines] == [[0, 2], [4], [6]]
    for line, cycle in zip(lines, result.cycles, strict=True):
        assert line["seq_start"] == cycle.seq_start and line["eval_loss"] == cycle.eval_loss
        assert line["train_loss"] > 0 and line["tokens_trained"] > 0 and line["grad_norm"] > 0
        assert set(line["op_seconds"]) >= {"forward_backward", "optim_step", "forward"}
    assert lines[1]["seq_start"] == lines[0]["seq_end"]
    assert lines[2]["learning_rate"] == pytest.approx(expected[-1])

    flow_run_id = state.state_details.flow_run_id
    parent = {artifact.type: artifact for artifact in artifacts_of(flow_run_id)}
    assert set(parent) == {"progress", "markdown"}
    assert float(parent["progress"].data) == 100.0
    for needle in (result.checkpoint, result.adapter.sha256, "eval loss, step 6", "SFT flow"):
        assert needle in parent["markdown"].data
    assert all(re.fullmatch(r"[a-z0-9-]+", artifact.key) for artifact in parent.values())
    cycles = subflow_runs(flow_run_id)
    assert [run.name for run in cycles] == ["cycle-0", "cycle-1", "cycle-2"]
    for cycle, run in enumerate(cycles):
        markdown, row = cycle_artifact(run.id)
        assert row["cycle"] == str(cycle)
        assert float(row["eval_loss"]) == pytest.approx(lines[cycle]["eval_loss"], abs=1e-6)
        assert "evals" not in row and float(row["seconds_forward_backward"]) > 0
        assert "| forward_backward | succeeded |" in markdown
    (session,) = flow_run_sessions(inspector, flow_run_id)
    assert session.status == "closed"


def test_pipelined_and_unpipelined_steps_train_the_same_adapter(
    whitney: EmbeddedWhitney, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipelined, each step's forward_backward and optim_step are submitted together (the
    training tail the RL flow submits, CycleContext.run_tail): the first
    forward_backward is held back until the optim_step behind it is on its way, which only a
    block submitted before any answer allows; the same seq-id layout and, the server executing
    in seq order, the same adapter as one call after another."""
    config = small_sft_config(whitney.url)
    one_by_one = sft_flow(config)

    held = hold_first_forward_backward(monkeypatch, behind=1)
    pipelined = sft_flow(config.model_copy(update={"pipelined": True}))
    monkeypatch.undo()

    assert held == [(2, True)]  # after cycle 0's eval forward at seq 1
    assert pipelined.adapter.sha256 == one_by_one.adapter.sha256
    assert pipelined.eval_losses == one_by_one.eval_losses
    layout = [row["kind"] for row in assert_executed_once_in_order(whitney, pipelined.run_id)]
    assert layout == [row["kind"] for row in journal_rows(whitney, one_by_one.run_id)]


def test_a_retried_cycle_replays_exactly(
    whitney: EmbeddedWhitney, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_sft_config(whitney.url)
    undisturbed = sft_flow(config)

    calls = fail_once(monkeypatch, "forward_backward", call=3)  # cycle 1's first step
    state = sft_flow(config, return_state=True)
    monkeypatch.undo()

    assert state.is_completed(), state.message
    result = state.result()
    assert result.adapter.sha256 == undisturbed.adapter.sha256
    assert result.eval_losses == undisturbed.eval_losses
    assert calls[2] == calls[3]  # the replay resent cycle 1's first forward_backward
    assert_executed_once_in_order(whitney, result.run_id)
    cycles = subflow_runs(state.state_details.flow_run_id)
    assert [run.run_count for run in cycles] == [1, 2, 1]
    names = {run.name for run in task_runs_of(cycles[1].id, expected=1)}
    assert f"forward_backward[seq={calls[2]}]" in names


def test_resume_from_a_checkpoint_ends_with_the_same_adapter(whitney: EmbeddedWhitney) -> None:
    config = small_sft_config(whitney.url)
    undisturbed = sft_flow(config)
    checkpoint = undisturbed.cycles[0].checkpoint
    assert checkpoint is not None and checkpoint.endswith("/states/cycle-0")

    resumed = sft_flow(config.model_copy(update={"resume_from": checkpoint}))
    assert resumed.resumed_from == checkpoint and resumed.run_id != undisturbed.run_id
    assert [cycle.cycle for cycle in resumed.cycles] == [1, 2]
    assert resumed.eval_steps == [4, 6]
    assert resumed.eval_losses == pytest.approx(undisturbed.eval_losses[2:], rel=1e-6)
    assert resumed.adapter.sha256 == undisturbed.adapter.sha256


def test_a_failed_cycle_releases_everything(
    whitney: EmbeddedWhitney, inspector: WhitneyClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_once(monkeypatch, "forward_backward", call=3, times=100)
    state = sft_flow(small_sft_config(whitney.url, cycle_retries=0), return_state=True)
    assert state.is_failed()
    (run,) = assert_released(inspector, state.state_details.flow_run_id)
    assert run.step == 2  # cycle 0 trained its two steps; cycle 1 failed after forward_backward


def test_inside_a_parent_flow_a_failure_releases_the_sft_session(
    whitney: EmbeddedWhitney, inspector: WhitneyClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How distillation trains its teacher: sft_flow as a subflow. Its session bears its own
    flow run id; the hooks look at every flow run from the failing one up to the top."""
    config = small_sft_config(whitney.url, cycle_retries=0)

    @flow(name="sft-parent")
    def parent(config: SFTConfig) -> None:
        sft_flow(config)

    fail_once(monkeypatch, "optim_step", call=3, times=100)
    state = parent(config, return_state=True)
    assert state.is_failed()
    (child,) = subflow_runs(state.state_details.flow_run_id)
    (run,) = assert_released(inspector, child.id)
    assert run.step == 3  # the third optim_step ran, then cycle 1 failed


def test_a_bad_config_opens_nothing(
    whitney: EmbeddedWhitney, inspector: WhitneyClient, tmp_path: Path
) -> None:
    sessions_before = len(inspector.list_sessions())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": 3}\n')
    with pytest.raises(ConfigError, match=r"data_path: .*bad\.jsonl line 2: field 'completion'"):
        sft_flow(small_sft_config(whitney.url, data_path=str(bad)))
    with pytest.raises(ConfigError, match="resume_from: .* nothing is left to train"):
        sft_flow(small_sft_config(whitney.url, resume_from="whitney://runs/run-x/states/cycle-2"))
    assert len(inspector.list_sessions()) == sessions_before
