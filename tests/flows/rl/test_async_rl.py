"""Async off-policy RL (max_staleness): the learning on `digits`, the overlap on the server, and
the same adapter whatever the timing: two runs, a faulty server, a replayed cycle, a resumed
flow run; reference KL, resampling, the critic, a budget and cancellation keep working."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flowtest_helpers import (
    assert_executed_once_in_order,
    assert_finished,
    assert_released,
    cancel_and_join,
)
from flowtest_recipe_helpers import replay_after_one_failure
from flowtest_resume_plugins import fail_once_at_cycle

from flows.core.loop.cost import Budget
from flows.core.loop.off_policy_schedule import Schedule
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.metrics import RLResult
from tasks import operations
from tasks.names import FLOW_RUN_LABEL
from tests.local.helpers import journal_rows
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

LEARNING_CYCLES = 10
"""The learning tests' cycles, a smoke: the reward leaves the floor (last 2 cycles 0.221 for
importance_sampling 1 step behind, 0.143 for ppo 2 behind, from 0.0095 over the first 2, on
this AMD EPYC). Their 18 cycles, to above 0.6 over the last 5, are `python
benchmarks/learning_thresholds.py async`; 30 cycles reach 0.96 and 0.99, measured by
benchmarks/staleness_learning.py."""


def first_two(result: RLResult) -> float:
    return statistics.fmean(cycle.reward_mean for cycle in result.cycles[:2])


def last_two(result: RLResult) -> float:
    return statistics.fmean(cycle.reward_mean for cycle in result.cycles[-2:])


def assert_on_schedule(config: RLConfig, result: RLResult, first: int = 0) -> None:
    """Each cycle sampled from `cycle-{k(n)}` and says how stale that was; on-policy cycles
    have kl_sample_train exactly 0 (sampler and learner logprobs are the same bits), stale
    ones measure it against the current weights."""
    schedule = Schedule(config.max_staleness, first, config.checkpoint_every, config.cycles)
    for metrics in result.cycles:
        assert metrics.sampler_id == f"cycle-{schedule.sampler_cycle(metrics.cycle)}"
        assert metrics.staleness == schedule.staleness_of(metrics.cycle)
        assert metrics.kl_sample_train is not None
        if metrics.staleness == 0:
            assert metrics.kl_sample_train == 0.0, metrics.cycle


def overlaps(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(sample seq id, forward_backward seq id) pairs of a later cycle's sample that ran while
    an earlier forward_backward ran, by the server's timestamps."""
    backwards = [row for row in rows if row["kind"] == "forward_backward"]
    return [
        (sample["seq_id"], backward["seq_id"])
        for sample in rows
        if sample["kind"] == "sample"
        for backward in backwards
        if sample["seq_id"] < backward["seq_id"]
        and sample["started_at"] < backward["finished_at"]
        and backward["started_at"] < sample["finished_at"]
    ]


def test_importance_sampling_learns_digits_one_step_off_policy_beside_the_training(
    whitney: EmbeddedWhitney,
) -> None:
    config = RLConfig(api_url=whitney.url, cycles=LEARNING_CYCLES, max_staleness=1)
    result = rl_flow(config)
    rewards = [round(cycle.reward_mean, 3) for cycle in result.cycles]
    print(f"importance_sampling, max_staleness 1: rewards {rewards}")
    assert len(result.cycles) == LEARNING_CYCLES
    assert first_two(result) < 0.1 and last_two(result) > first_two(result) + 0.08, rewards
    assert_on_schedule(config, result)
    assert all(cycle.kl_sample_train != 0.0 for cycle in result.cycles if cycle.staleness)
    rows = assert_executed_once_in_order(whitney, result.run_id)
    assert overlaps(rows), "no later cycle's sample ran beside a forward_backward"


def test_ppo_learns_digits_two_steps_off_policy(whitney: EmbeddedWhitney) -> None:
    config = RLConfig(api_url=whitney.url, cycles=LEARNING_CYCLES, max_staleness=2, loss="ppo")
    result = rl_flow(config)
    rewards = [round(cycle.reward_mean, 3) for cycle in result.cycles]
    print(f"ppo, max_staleness 2 (decoupled clipping): rewards {rewards}")
    assert len(result.cycles) == LEARNING_CYCLES
    assert first_two(result) < 0.1 and last_two(result) > first_two(result) + 0.08, rewards
    assert_on_schedule(config, result)


@pytest.fixture
def stale(small_config: RLConfig) -> RLConfig:
    """6 cycles two steps behind, a checkpoint after cycle 2 (and the final one, cycle-5)."""
    return small_config.model_copy(
        update={"cycles": 6, "max_staleness": 2, "checkpoint_every": 3, "loss": "ppo"}
    )


_undisturbed: dict[str, RLResult] = {}


@pytest.fixture
def undisturbed(stale: RLConfig) -> RLResult:
    """The undisturbed run of `stale` (once per server and config)."""
    key = stale.model_dump_json()
    if key not in _undisturbed:
        _undisturbed[key] = rl_flow(stale)
    return _undisturbed[key]


def test_two_runs_and_a_faulty_server_train_the_same_adapter(
    whitney: EmbeddedWhitney,
    stale: RLConfig,
    undisturbed: RLResult,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert_on_schedule(stale, undisturbed)
    assert rl_flow(stale).adapter.sha256 == undisturbed.adapter.sha256
    with EmbeddedWhitney(drop_after_commit_rate=0.2, fail_before_rate=0.1, fault_seed=5) as faulty:
        monkeypatch.setenv("WHITNEY_API_KEY", faulty.api_key)
        result = rl_flow(stale.model_copy(update={"api_url": faulty.url}))
        assert_executed_once_in_order(faulty, result.run_id)
    assert result.adapter.sha256 == undisturbed.adapter.sha256


def test_a_cycle_failing_after_its_forward_backward_replays(
    stale: RLConfig, undisturbed: RLResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    replay = replay_after_one_failure(
        stale,
        monkeypatch,
        lambda kind, payload: kind == "forward_backward",
        4,  # cycle 3's: it reads its samples from the journal, requested by cycle 1
        owner=operations,
        name="execute_operation",
        undisturbed=undisturbed,
    )
    assert replay.result.adapter.sha256 == undisturbed.adapter.sha256


def test_a_retried_flow_run_resumes_from_its_checkpoint(
    stale: RLConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = stale.model_copy(
        update={"env": "flowtest_resume_plugins:FailOnceAtCycle", "cycle_retries": 0}
    )
    reference = rl_flow(config)
    fail_once_at_cycle(monkeypatch, 4, tmp_path)
    state = rl_flow.with_options(retries=1)(config, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result.resumed_from is not None and result.resumed_from.endswith("/states/cycle-2")
    assert [metrics.cycle for metrics in result.cycles] == [3, 4, 5]
    assert_on_schedule(config, result, first=3)
    assert result.adapter.sha256 == reference.adapter.sha256


@pytest.mark.parametrize(
    "update",
    [
        {"reference_kl": {"enabled": True}},
        {"resample_rounds": 2},
        {"loss": "ppo_critic"},
    ],
    ids=["reference_kl", "resampling", "critic"],
)
def test_the_recipes_extras_work_off_policy(
    whitney: EmbeddedWhitney, small_config: RLConfig, update: dict[str, Any]
) -> None:
    config = RLConfig.model_validate(
        small_config.model_dump() | {"cycles": 4, "max_staleness": 1, **update}
    )
    result = rl_flow(config)
    assert_on_schedule(config, result)
    assert [metrics.staleness for metrics in result.cycles] == [0, 1, 1, 1]
    assert_executed_once_in_order(whitney, result.run_id)
    if "reference_kl" in update:
        assert all("reference_kl" in metrics.recipe_metrics for metrics in result.cycles)
    if "resample_rounds" in update:
        assert sum(metrics.groups_resampled for metrics in result.cycles) > 0
    if "loss" in update:
        assert all("value_loss" in metrics.recipe_metrics for metrics in result.cycles)


def test_a_budget_stops_an_off_policy_flow_cleanly(
    small_config: RLConfig, inspector: WhitneyClient
) -> None:
    config = small_config.model_copy(update={"cycles": 8, "max_staleness": 2})
    first = rl_flow(config.model_copy(update={"cycles": 2}))
    per_cycle = max(sum(c.get("tokens", 0) for c in m.usage.values()) for m in first.cycles)
    budget = Budget(max_tokens=int(3.5 * per_cycle))
    result = rl_flow(config.model_copy(update={"budget": budget}))
    assert 0 < len(result.cycles) < config.cycles
    assert result.budget_stop is not None
    assert result.checkpoint.endswith(f"/states/cycle-{len(result.cycles) - 1}")
    assert_finished(inspector, result.session_id)


def test_cancelling_an_off_policy_flow_releases_everything(
    small_config: RLConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    with EmbeddedWhitney() as server, WhitneyClient(server.url, server.api_key) as client:
        monkeypatch.setenv("WHITNEY_API_KEY", server.api_key)
        config = small_config.model_copy(
            update={
                "api_url": server.url,
                "cycles": 500,
                "max_staleness": 2,
                "metrics_path": str(metrics),
            }
        )
        states: list[Any] = []
        flow = threading.Thread(
            target=lambda: states.append(rl_flow(config, return_state=True)), daemon=True
        )
        flow.start()
        while not metrics.exists() or len(metrics.read_text().splitlines()) < 2:
            assert flow.is_alive()
            time.sleep(0.1)
        (session,) = client.list_sessions()
        flow_run_id = session.labels[FLOW_RUN_LABEL]
        cancel_and_join(flow_run_id, flow, states)
        (run,) = assert_released(client, flow_run_id)
        rows = journal_rows(server, run.run_id)
    assert {row["status"] for row in rows} <= {"succeeded", "cancelled"}
    assert all(row["executions"] <= 1 for row in rows)
