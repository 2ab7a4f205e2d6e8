"""Dynamic resampling: groups with uniform rewards are sampled again through the cycle's
client, up to `resample_rounds`, then dropped; the records count both, the loss trains on the
rest, and a cycle that fails after resampling replays exactly."""

from __future__ import annotations

import random

import pytest
from flowtest_helpers import assert_executed_once_in_order
from flowtest_recipe_helpers import journaled, replay_after_one_failure

from flows.core.environments import Completion
from flows.core.environments.lowercase import LowercaseEnvironment
from flows.core.loop.plans import derive_seed
from flows.rl.batch import Group, GroupScore, resample_uniform_groups
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney.local import EmbeddedWhitney
from whitney.tokenizers import get_tokenizer

QUIET = "Quiet: "


class HalfUniform(LowercaseEnvironment):
    """Every other prompt is `Quiet: `, whose completions all get reward 0 (a uniform group
    whatever is sampled); the others are the lowercase environment's."""

    def prompts(self, cycle: int, count: int, seed: int) -> list[str]:
        rng = random.Random(seed)
        return [
            QUIET if index % 2 == 0 else rng.choice(("Say: ", "Text: ")) for index in range(count)
        ]

    def reward(self, prompt: str, completion: Completion) -> float:
        return 0.0 if prompt == QUIET else super().reward(prompt, completion)


class AllUniform(LowercaseEnvironment):
    """Every group is uniform."""

    def reward(self, prompt: str, completion: Completion) -> float:
        return 0.5


def fake_group(index: int, rewards: list[float]) -> Group:
    request = {"prompt": {"token_ids": [1, index]}, "sampling_params": {"seed": 0}}
    sample = {"sequences": [], "index": index}
    return Group(
        index, f"p{index}", request, sample, GroupScore(rewards, [r - 0.5 for r in rewards])
    )


def test_resampling_rounds_seeds_and_drops() -> None:
    sent: list[list[dict]] = []
    # group 1 stays uniform; group 2 gets signal on its second draw; group 0 has signal already
    draws = {1: iter([[0.0, 0.0]] * 3), 2: iter([[1.0, 1.0], [1.0, 0.0]])}

    def sample_groups(requests: list[dict]) -> list[dict]:
        sent.append(requests)
        return [{"index": request["prompt"]["token_ids"][1]} for request in requests]

    def score(prompt: str, sample: dict) -> GroupScore:
        rewards = next(draws[sample["index"]])
        mean = sum(rewards) / len(rewards)
        return GroupScore(rewards, [r - mean for r in rewards])

    groups = [fake_group(0, [1.0, 0.0]), fake_group(1, [0.0, 0.0]), fake_group(2, [1.0, 1.0])]
    final = resample_uniform_groups(groups, 3, sample_groups, score, seed=7, cycle=4)

    assert [[request["prompt"]["token_ids"][1] for request in batch] for batch in sent] == [
        [1, 2],
        [1, 2],
        [1],
    ]
    assert [request["sampling_params"]["seed"] for request in sent[1]] == [
        derive_seed(7, 4, 1, 2),
        derive_seed(7, 4, 2, 2),
    ]
    assert [(group.resamples, group.dropped) for group in final] == [
        (0, False),
        (3, True),
        (2, False),
    ]
    assert final[2].score.rewards == [1.0, 0.0]
    assert final[0] == groups[0]
    assert resample_uniform_groups(groups, 0, sample_groups, score, 7, 4) == groups


def base_config(small_config: RLConfig, env: str, **update: object) -> RLConfig:
    return small_config.model_copy(
        update={"env": env, "prompts_per_cycle": 4, "resample_rounds": 2, **update}
    )


def test_uniform_half_is_resampled_then_dropped_and_the_rest_trains(
    whitney: EmbeddedWhitney, small_config: RLConfig
) -> None:
    config = base_config(small_config, "test_resampling:HalfUniform")
    result = rl_flow(config)

    quiet = get_tokenizer(config.base_model).encode(QUIET)
    rows = assert_executed_once_in_order(whitney, result.run_id)
    backward = journaled(whitney, result.run_id, "forward_backward")
    for cycle, op in zip(result.cycles, backward, strict=True):
        assert cycle.groups_dropped >= 2  # the two Quiet groups, at least
        assert cycle.groups_resampled >= cycle.groups_dropped
        assert cycle.all_zero_group_share >= 0.5  # first draws: the Quiet half is uniform
        data = op["payload"]["data"]
        assert len(data) == (4 - cycle.groups_dropped) * config.group_size
        for datum in data:  # no Quiet prompt in the loss
            assert datum["input"]["token_ids"][1 : 1 + len(quiet)] != quiet
        assert cycle.grad_norm > 0 and cycle.tokens_trained > 0
    dropped = sum(cycle.groups_dropped for cycle in result.cycles)
    resample_requests = sum(row["kind"] == "sample" for row in rows) - 4 * config.cycles
    assert resample_requests >= 2 * dropped  # each dropped group was resampled twice
    print(
        "resampled, dropped per cycle:",
        [(cycle.groups_resampled, cycle.groups_dropped) for cycle in result.cycles],
    )


def test_a_cycle_whose_groups_are_all_dropped_trains_nothing(small_config: RLConfig) -> None:
    config = base_config(small_config, "test_resampling:AllUniform", resample_rounds=1)
    result = rl_flow(config)
    for cycle in result.cycles:
        assert (cycle.groups_resampled, cycle.groups_dropped) == (4, 4)
        assert cycle.loss == 0.0 and cycle.grad_norm == 0.0


def test_a_cycle_failing_after_resampling_replays_exactly(
    whitney: EmbeddedWhitney, small_config: RLConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = base_config(
        small_config, "test_resampling:HalfUniform", concurrent_sampling=False, loss="ppo"
    )
    resample_seeds = {derive_seed(config.seed, 1, index, 1) for index in range(4)}

    def a_resample(kind: str, payload: dict) -> bool:
        seed = payload.get("sampling_params", {}).get("seed")
        return kind == "sample" and seed in resample_seeds

    # cycle 1 fails after its first resample
    undisturbed, _, result, failed = replay_after_one_failure(config, monkeypatch, a_resample, 1)
    assert failed
    assert [(c.groups_resampled, c.groups_dropped) for c in result.cycles] == [
        (c.groups_resampled, c.groups_dropped) for c in undisturbed.cycles
    ]
    assert_executed_once_in_order(whitney, result.run_id)
