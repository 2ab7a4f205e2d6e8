"""Checks the recipe tests make: the provider table as (loss, provider) pairs, the payloads
the server journaled, a recipe's auxiliary run, and a cycle failing once after a given call
(`replay_after_one_failure`, which the replay, judge and resampling tests use too)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, NamedTuple, get_args

import pytest
from flowtest_helpers import assert_executed_once_in_order, journal_rows
from prefect.states import State

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.metrics import RLResult
from flows.rl.recipes import CRITIC_PROVIDERS, RECIPES, AuxiliaryRun, Recipe, load_recipe
from flows.rl.recipes.ppo import RECIPE as PPO
from tasks import operations
from tasks.operations import SequencedClient
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney
from whitney.losses import PROVIDER_LOSS_SUPPORT
from whitney.wire import Provider

PROVIDERS: tuple[str, ...] = get_args(Provider)


def serves(provider: str, loss: str) -> bool:
    """The provider advertises the loss and offers every run its recipe needs."""
    if loss not in PROVIDER_LOSS_SUPPORT[provider]:
        return False
    recipe = load_recipe(loss)
    return all(
        run.role != "critic" or provider in CRITIC_PROVIDERS for run in recipe.auxiliary_runs
    )


SERVED = [(loss, provider) for loss in RECIPES for provider in PROVIDERS if serves(provider, loss)]
REFUSED = [
    (loss, provider) for loss in RECIPES for provider in PROVIDERS if not serves(provider, loss)
]


def journaled(server: EmbeddedWhitney, run_id: str, kind: str | None = None) -> list[dict]:
    """The run's journaled operations (`journal_rows`, the payload decoded), in order."""
    return [
        {**row, "payload": json.loads(row["payload"])}
        for row in journal_rows(server, run_id)
        if kind is None or row["kind"] == kind
    ]


def auxiliary_run_id(inspector: WhitneyClient, session_id: str, policy_run_id: str) -> str:
    """The one run of the session beside the policy."""
    (auxiliary,) = [
        run_id
        for run_id in inspector.get_session(session_id).run_ids or []
        if run_id != policy_run_id
    ]
    return auxiliary


class Replay(NamedTuple):
    undisturbed: RLResult
    state: State
    result: RLResult
    matched: list[int]
    """The seq ids of the calls `fails_after` matched, replays included."""


def replay_after_one_failure(
    config: RLConfig,
    monkeypatch: pytest.MonkeyPatch,
    fails_after: Callable[[str, dict[str, Any]], bool],
    count: int,
    owner: object = SequencedClient,
    name: str = "execute",
    undisturbed: RLResult | None = None,
) -> Replay:
    """Run the flow undisturbed (unless `undisturbed` is a run of `config` already done), then
    with its cycle failing once right after the `count`-th call of `owner.name` (an execute
    taking `kind` and `payload`, as `SequencedClient.execute` and
    `tasks.operations.execute_operation` do) for which `fails_after(kind, payload)` holds was
    answered: the flow completes (the failed cycle is retried and replays) with the adapter of
    the undisturbed run."""
    if undisturbed is None:
        undisturbed = rl_flow(config)
    execute = getattr(owner, name)
    signature = inspect.signature(execute)
    matched: list[int] = []

    def fail_once(*args: Any, **options: Any) -> Any:
        operation = execute(*args, **options)
        call = signature.bind(*args, **options).arguments
        if fails_after(call["kind"], call["payload"]):
            matched.append(operation.seq_id)
            if len(matched) == count:
                raise RuntimeError(
                    f"injected: the cycle fails after {call['kind']} [seq={operation.seq_id}]"
                )
        return operation

    with monkeypatch.context() as patch:
        patch.setattr(owner, name, fail_once)
        state = rl_flow(config, return_state=True)

    assert state.is_completed(), state.message
    result = state.result()
    assert result.adapter.sha256 == undisturbed.adapter.sha256
    return Replay(undisturbed, state, result, matched)


def replay_after_second_forward_backward(
    config: RLConfig, monkeypatch: pytest.MonkeyPatch
) -> Replay:
    """`replay_after_one_failure` with cycle 1 failing after its forward_backward (the second),
    in `operations.execute_operation` (what every operation task runs, submitted or not): the
    rewards per cycle are the undisturbed run's too."""
    replay = replay_after_one_failure(
        config,
        monkeypatch,
        lambda kind, payload: kind == "forward_backward",
        2,
        owner=operations,
        name="execute_operation",
    )
    assert [cycle.reward_mean for cycle in replay.result.cycles] == [
        cycle.reward_mean for cycle in replay.undisturbed.cycles
    ]
    return replay


def assert_replays_exactly(
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    config: RLConfig,
    monkeypatch: pytest.MonkeyPatch,
    fails_after: Callable[[str, dict[str, Any]], bool],
    count: int,
) -> list[int]:
    """`replay_after_one_failure` of the policy's calls, for a recipe with an auxiliary run:
    the recipe's metrics are the same too, and both runs executed every seq id once. The seq
    ids of the matching calls, replays included."""
    undisturbed, _, result, matched = replay_after_one_failure(
        config, monkeypatch, fails_after, count
    )
    assert [cycle.recipe_metrics for cycle in result.cycles] == [
        cycle.recipe_metrics for cycle in undisturbed.cycles
    ]
    assert_executed_once_in_order(whitney, result.run_id)
    auxiliary = auxiliary_run_id(inspector, result.session_id, result.run_id)
    assert_executed_once_in_order(whitney, auxiliary)
    return matched


PPO_WITH_CRITIC = Recipe(
    name="ppo+critic",
    loss_function="ppo",
    build_loss=PPO.build_loss,
    auxiliary_runs=(AuxiliaryRun("critic", role="critic"),),
)
"""A recipe whose loss every provider serves, but which needs a critic run."""
