"""Pipelining changes nothing but the waiting: a pipelined flow trains exactly as an
unpipelined one (the same adapter sha256), with each cycle's tail submitted together and the
next cycle sampling from the sampler the tail published by name; a refused tail operation
ends the cycle at once instead of leaving operations waiting behind a gap."""

from __future__ import annotations

from typing import Any

import pytest
from flowtest_helpers import (
    assert_executed_once_in_order,
    hold_first_forward_backward,
    journal_rows,
)

from flows.core.loop.context import tail_calls
from flows.rl import recipes
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney import wire
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


def journal(client: WhitneyClient, run_id: str) -> list[wire.Operation]:
    return client.journal(run_id, limit=1000)


def test_tail_calls_in_seq_order() -> None:
    payload: dict[str, Any] = {"data": [], "loss_function": "importance_sampling"}
    calls = tail_calls(4, payload, {"type": "adamw"}, checkpoint=True, publish_next=True)
    assert calls == [
        ("forward_backward", payload, None),
        ("optim_step", {"optimizer": {"type": "adamw"}}, None),
        ("save_state", {"name": "cycle-4"}, None),
        ("save_weights_for_sampler", {"name": "cycle-5"}, None),
    ]
    bare = tail_calls(4, payload, {"type": "adamw"}, checkpoint=False, publish_next=False)
    assert [call.kind for call in bare] == ["forward_backward", "optim_step"]


def test_concurrent_sampling_on_and_off_train_the_same_adapter(
    whitney: EmbeddedWhitney, small_config: RLConfig
) -> None:
    """Submitted together, a cycle's sample requests reach the engine as one batch; one after
    another, as single requests. The engine's numbers do not depend on batch-mates, so both
    train the same adapter, bit for bit."""
    config = small_config.model_copy(update={"cycles": 3})
    together = rl_flow(config)
    one_by_one = rl_flow(config.model_copy(update={"concurrent_sampling": False}))
    assert together.adapter.sha256 == one_by_one.adapter.sha256
    assert [c.reward_mean for c in together.cycles] == [c.reward_mean for c in one_by_one.cycles]
    assert [c.kl_sample_train for c in together.cycles] == [0.0] * 3


def test_pipelined_and_unpipelined_flows_train_the_same_adapter(
    whitney: EmbeddedWhitney, small_config: RLConfig, inspector: WhitneyClient
) -> None:
    config = small_config.model_copy(update={"cycles": 4, "checkpoint_every": 2})
    pipelined = rl_flow(config)
    unpipelined = rl_flow(config.model_copy(update={"pipelined": False}))

    assert pipelined.adapter.sha256 == unpipelined.adapter.sha256
    assert [cycle.reward_mean for cycle in pipelined.cycles] == [
        cycle.reward_mean for cycle in unpipelined.cycles
    ]
    assert [cycle.loss for cycle in pipelined.cycles] == [
        cycle.loss for cycle in unpipelined.cycles
    ]
    for result in (pipelined, unpipelined):
        assert_executed_once_in_order(whitney, result.run_id)
        assert [cycle.seq_start for cycle in result.cycles[1:]] == [
            cycle.seq_end for cycle in result.cycles[:-1]
        ]

    groups = config.prompts_per_cycle
    samples = ["sample"] * groups
    train = ["forward_backward", "optim_step"]
    publish = ["save_weights_for_sampler"]
    operations = journal(inspector, pipelined.run_id)
    # cycle 0 publishes its own sampler; every tail publishes the next cycle's, except the
    # last; cycle 1 (checkpoint_every 2) checkpoints between its optim_step and the sampler
    assert [op.kind for op in operations] == (
        publish + samples + train + publish
        + samples + train + ["save_state"] + publish
        + samples + train + publish
        + samples + train
        + ["save_state", "export_lora"]
    )  # fmt: skip
    samplers = [op.result["sampler_id"] for op in operations if op.kind in publish]
    assert samplers == ["cycle-0", "cycle-1", "cycle-2", "cycle-3"]
    sampled_from = [op.sampler_id for op in operations if op.kind == "sample"]
    assert sampled_from == [f"cycle-{cycle}" for cycle in range(4) for _ in range(groups)]
    checkpoints = [op.result["checkpoint"] for op in operations if op.kind == "save_state"]
    run = pipelined.run_id
    assert checkpoints == [f"whitney://runs/{run}/states/cycle-{n}" for n in (1, 3)]
    assert pipelined.checkpoint == checkpoints[-1]
    # after the first, a cycle's seq ids start after the sampler the previous tail published
    assert [cycle.seq_start for cycle in pipelined.cycles[1:]] == [
        op.seq_id + 1 for op in operations if op.kind in publish
    ][1:]

    operations = journal(inspector, unpipelined.run_id)
    assert [op.kind for op in operations] == (
        publish + samples + train
        + publish + samples + train + ["save_state"]
        + publish + samples + train
        + publish + samples + train
        + ["save_state", "export_lora"]
    )  # fmt: skip
    samplers = [op.result["sampler_id"] for op in operations if op.kind in publish]
    assert samplers == [f"sampler-{op.seq_id}" for op in operations if op.kind in publish]


def test_a_pipelined_tail_is_in_flight_together(
    small_config: RLConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first forward_backward is held back until the optim_step and the
    save_weights_for_sampler behind it are on their way: only possible if all three were
    submitted before any answered."""
    held = hold_first_forward_backward(monkeypatch, behind=2)
    config = small_config.model_copy(update={"cycles": 2, "checkpoint_every": 0})
    result = rl_flow(config)
    assert held == [(result.cycles[0].seq_end - 3, True)]  # fb, optim_step, next sampler


def test_a_refused_tail_operation_cancels_the_run_instead_of_waiting_behind_a_gap(
    whitney: EmbeddedWhitney,
    small_config: RLConfig,
    inspector: WhitneyClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        recipes.RECIPES, "importance_sampling", "flowtest_resume_plugins:REFUSED_AT_CYCLE_1"
    )
    state = rl_flow(small_config, return_state=True)
    assert state.is_failed()

    (session,) = inspector.list_sessions(
        label=f"prefect.flow-run-id:{state.state_details.flow_run_id}"
    )
    (run_id,) = inspector.get_session(session.session_id).run_ids
    assert inspector.get_run(run_id).status == "cancelled"
    rows = journal_rows(whitney, run_id)
    statuses = {row["seq_id"]: (row["kind"], row["status"]) for row in rows}
    refused = next(
        seq for seq in range(1, max(statuses) + 1) if seq not in statuses
    )  # cycle 1's forward_backward: refused, never journaled
    assert statuses[refused + 1] == ("optim_step", "cancelled")
    assert statuses[refused + 2] == ("save_weights_for_sampler", "cancelled")
