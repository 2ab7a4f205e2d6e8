"""PPO with a critic end to end: the critic run (`role: "critic"`) trains in the same cycles
as the policy and its value loss falls; a failing flow leaves neither run open; a cycle that
fails after the critic's update replays exactly, on both runs."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from flowtest_helpers import assert_executed_once_in_order, assert_released
from flowtest_recipe_helpers import assert_replays_exactly, auxiliary_run_id, journaled

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


def critic_run_id(inspector: WhitneyClient, session_id: str, policy_run_id: str) -> str:
    critic = auxiliary_run_id(inspector, session_id, policy_run_id)
    assert inspector.get_run(critic).role == "critic"
    return critic


def test_the_critic_learns_beside_the_policy(
    whitney: EmbeddedWhitney, inspector: WhitneyClient, small_config: RLConfig
) -> None:
    config = small_config.model_copy(update={"loss": "ppo_critic", "cycles": 6})
    result = rl_flow(config)

    value_losses = [cycle.recipe_metrics["value_loss"] for cycle in result.cycles]
    print("value loss per cycle:", [round(value, 4) for value in value_losses])
    assert statistics.fmean(value_losses[-3:]) < 0.6 * value_losses[0]
    assert value_losses[-1] < value_losses[0]

    critic = critic_run_id(inspector, result.session_id, result.run_id)
    rows = assert_executed_once_in_order(whitney, critic)
    trained = [row["kind"] for row in rows if row["kind"] != "save_state"]  # checkpoints
    assert trained == [
        kind
        for _ in range(config.cycles)
        for kind in ["forward"] * config.prompts_per_cycle + ["forward_backward", "optim_step"]
    ]
    assert inspector.get_run(critic).step == config.cycles
    assert inspector.get_run(critic).status == "finished"
    # each cycle ends on the critic where the next one starts (the last: the final save_state)
    starts = [row["seq_id"] for row in rows if row["kind"] == "forward"]
    starts = starts[:: config.prompts_per_cycle][1:] + [rows[-1]["seq_id"]]
    assert [cycle.auxiliary_seq_end["critic"] for cycle in result.cycles] == starts
    for op in journaled(whitney, critic, "forward_backward"):
        assert op["payload"]["loss_function"] == "ppo_critic"
        assert op["payload"]["loss_config"] == {"value_clip": 0.2}
        data = op["payload"]["data"]
        assert len(data) == config.prompts_per_cycle * config.group_size
        assert {"values", "returns", "weights"} == set(data[0]["loss_inputs"])
    for op in journaled(whitney, result.run_id, "forward_backward"):
        assert op["payload"]["loss_function"] == "ppo"
        advantages = op["payload"]["data"][0]["loss_inputs"]["advantages"]["values"]
        assert len(set(advantages)) > 2  # per-token GAE advantages, not one per sequence


def test_a_failing_critic_flow_leaves_nothing_open(
    inspector: WhitneyClient, small_config: RLConfig
) -> None:
    config = small_config.model_copy(
        update={
            "loss": "ppo_critic",
            "env": "flowtest_plugins:BrokenAtCycle1",
            "cycles": 4,
            "cycle_retries": 0,
        }
    )
    state = rl_flow(config, return_state=True)
    assert state.is_failed()
    runs = assert_released(inspector, state.state_details.flow_run_id)
    assert sorted(run.role for run in runs) == ["critic", "policy"]
    assert {run.step for run in runs} == {1}  # cycle 0 trained both, cycle 1 failed


def test_a_cycle_failing_after_the_critic_update_replays_exactly(
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    small_config: RLConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = small_config.model_copy(update={"loss": "ppo_critic"})
    critic_lr = config.critic.learning_rate

    def critic_step(kind: str, payload: dict[str, Any]) -> bool:
        return kind == "optim_step" and payload["optimizer"]["learning_rate"] == critic_lr

    critic_steps = assert_replays_exactly(whitney, inspector, config, monkeypatch, critic_step, 2)
    assert critic_steps[1] == critic_steps[2]  # the replay resent the same seq id
