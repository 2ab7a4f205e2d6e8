"""Exactly-once: a cycle that fails after its forward_backward is retried by Prefect and
replays; the adapter equals an undisturbed run's and the server executed every seq id once.
The same holds under server faults, and for extra calls a recipe makes through ctx."""

from __future__ import annotations

import pytest
from flowtest_helpers import assert_executed_once_in_order, subflow_runs, task_runs_of
from flowtest_recipe_helpers import replay_after_second_forward_backward

from flows.rl import recipes
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney.local import EmbeddedWhitney


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "unpipelined"])
def test_cycle_failing_after_forward_backward_replays_exactly(
    whitney: EmbeddedWhitney,
    small_config: RLConfig,
    monkeypatch: pytest.MonkeyPatch,
    pipelined: bool,
) -> None:
    small_config = small_config.model_copy(update={"pipelined": pipelined})
    _, state, result, backward_calls = replay_after_second_forward_backward(
        small_config, monkeypatch
    )
    # cycle 1's forward_backward was sent twice (first attempt, then the replay), same seq id
    assert backward_calls[1] == backward_calls[2]
    rows = assert_executed_once_in_order(whitney, result.run_id)
    assert rows[-2]["kind"] == "save_state" and rows[-1]["kind"] == "export_lora"

    flow_run_id = state.state_details.flow_run_id
    cycles = subflow_runs(flow_run_id)
    assert [run.name for run in cycles] == ["cycle-0", "cycle-1", "cycle-2"]
    assert [run.run_count for run in cycles] == [1, 2, 1]
    names = {run.name for run in task_runs_of(cycles[1].id, expected=1)}
    sample_seq = backward_calls[1] - small_config.prompts_per_cycle
    assert f"forward_backward[seq={backward_calls[1]}]" in names
    assert f"sample[seq={sample_seq}]" in names


def test_server_faults_change_nothing(
    whitney: EmbeddedWhitney, small_config: RLConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config.model_copy(update={"cycles": 10})
    fault_free = rl_flow(config)
    with EmbeddedWhitney(drop_after_commit_rate=0.2, fail_before_rate=0.1, fault_seed=3) as faulty:
        monkeypatch.setenv("WHITNEY_API_KEY", faulty.api_key)
        result = rl_flow(config.model_copy(update={"api_url": faulty.url}))
        rows = assert_executed_once_in_order(faulty, result.run_id)
    assert len(rows) == 10 * (2 + config.prompts_per_cycle + 1) + 2
    assert result.adapter.sha256 == fault_free.adapter.sha256


def test_recipe_calls_through_ctx_take_the_next_seq_ids(
    whitney: EmbeddedWhitney, small_config: RLConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(recipes.RECIPES, "importance_sampling", "flowtest_plugins:WITH_LOGPROBS")
    config = small_config.model_copy(update={"cycles": 2})
    first = rl_flow(config)  # pipelined: cycle 0's tail publishes cycle 1's sampler
    second = rl_flow(config.model_copy(update={"concurrent_sampling": False, "pipelined": False}))
    groups = config.prompts_per_cycle
    cycle_kinds = (
        ["save_weights_for_sampler"]
        + ["sample"] * groups
        + ["logprobs"] * groups
        + ["forward_backward", "optim_step"]
    )
    for result, tail_publishes in ((first, 1), (second, 0)):
        rows = assert_executed_once_in_order(whitney, result.run_id)
        assert [row["kind"] for row in rows] == cycle_kinds * 2 + ["save_state", "export_lora"]
        second_start = 1 + len(cycle_kinds) + tail_publishes
        assert [cycle.seq_start for cycle in result.cycles] == [1, second_start]
    assert first.adapter.sha256 == second.adapter.sha256
