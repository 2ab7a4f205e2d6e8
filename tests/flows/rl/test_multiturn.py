"""Multi-turn RL on the real server: the quiz's turns as blocks of `sample` operations, its
rewards and records checked against the journal by hand, the same adapter however the turns
are submitted, a cycle failed after its second turn that replays, the rollout limits, and the
failure policies on a flaky tool whose calls run as Prefect tasks."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import flowtest_multiturn
import pytest
from flowtest_helpers import (
    assert_executed_once_in_order,
    cycle_artifact,
    subflow_runs,
    task_runs_of,
)
from flowtest_multiturn import TOOL_TURNS, fails_for_good

from flows.cli.main import main
from flows.core.config import ConfigError
from flows.core.evaluation.config import EvalSettings
from flows.core.evaluation.plan import load_eval_plan
from flows.core.loop.plans import derive_seed
from flows.rl.config import RLConfig, RolloutSettings
from flows.rl.flow import rl_flow
from flows.rl.multi_turn_rollout import EpisodeFailed
from flows.rl.plan import check_rl_config
from tests.local.helpers import journal_rows
from whitney.local import EmbeddedWhitney
from whitney.renderers import RawRenderer
from whitney.tokenizers import ByteTokenizer

DIGITS, LETTERS = set("0123456789"), set("abcdefghijklmnopqrstuvwxyz")


@pytest.fixture
def quiz_config(small_config: RLConfig, tmp_path: Path) -> RLConfig:
    return small_config.model_copy(
        update={
            "env": "quiz",
            "cycles": 2,
            "prompts_per_cycle": 2,
            "group_size": 3,
            "max_tokens": 4,
            "metrics_path": str(tmp_path / "metrics.jsonl"),
        }
    )


def episodes_in_journal(rows: list[dict]) -> list[list[tuple[list[int], list[int]]]]:
    """Every episode of a journal's sample operations as its (prompt, action) turns: a
    sample whose prompt continues an earlier prompt and action is that episode's next turn
    (episodes whose transcripts are equal share a sample, one sequence each)."""
    episodes: list[list[tuple[list[int], list[int]]]] = []
    open_ends: dict[tuple[int, ...], list[int]] = {}  # prompt + action -> episodes
    for row in rows:
        if row["kind"] != "sample":
            continue
        prompt = json.loads(row["payload"])["prompt"]["token_ids"]
        continued = [end for end in open_ends if prompt[: len(end)] == list(end)]
        for sequence in json.loads(row["result"])["sequences"]:
            action = sequence["tokens"]
            if continued:
                end = max(continued, key=len)
                index = open_ends[end].pop(0)
                if not open_ends[end]:
                    del open_ends[end]
                    continued.remove(end)
                episodes[index].append((prompt, action))
            else:
                index = len(episodes)
                episodes.append([(prompt, action)])
            open_ends.setdefault(tuple(prompt + action), []).append(index)
    return episodes


def quiz_reward(turns: list[tuple[list[int], list[int]]]) -> float:
    """The quiz's reward, by hand: a prompt ending in `#` asks for a number, one ending in
    `:` for a word; an answer is right when it is one or more digits (a number) or lowercase
    letters (a word); the share of the 3 turns answered right."""
    right = 0
    for prompt, action in turns:
        allowed = DIGITS if prompt[-1] == ord("#") else LETTERS
        text = bytes(t for t in action if t < 256).decode(errors="replace")
        right += bool(text) and all(c in allowed for c in text)
    return right / 3


def cycle_rows(rows: list[dict], start: int, end: int) -> list[dict]:
    return [row for row in rows if start <= row["seq_id"] < end]


def test_quiz_turns_records_and_rewards_by_hand(
    whitney: EmbeddedWhitney, quiz_config: RLConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    state = rl_flow(quiz_config, return_state=True)
    result = state.result()
    rows = assert_executed_once_in_order(whitney, result.run_id)
    episodes_per_cycle = quiz_config.prompts_per_cycle * quiz_config.group_size
    lines = [json.loads(line) for line in Path(quiz_config.metrics_path).read_text().splitlines()]
    for cycle, line in zip(result.cycles, lines, strict=True):
        mine = cycle_rows(rows, cycle.seq_start, cycle.seq_end)
        kinds = [row["kind"] for row in mine]
        first = ["save_weights_for_sampler"] if cycle.cycle == 0 else []
        published = ["save_weights_for_sampler"] if cycle.cycle == 0 else []
        samples = kinds.count("sample")
        assert (
            kinds == first + ["sample"] * samples + ["forward_backward", "optim_step"] + published
        )
        # turn 0: a request per group (its 3 episodes); later turns: one per distinct
        # transcript of a group, at most one per episode
        assert (
            quiz_config.prompts_per_cycle
            < samples
            <= quiz_config.prompts_per_cycle + 2 * episodes_per_cycle
        )
        episodes = episodes_in_journal(mine)
        assert [len(turns) for turns in episodes] == [3] * episodes_per_cycle
        rewards = [quiz_reward(turns) for turns in episodes]
        assert cycle.reward_mean == pytest.approx(statistics.fmean(rewards))
        stats = cycle.episodes
        assert stats is not None
        assert (stats.episodes, stats.turns, stats.stop_reasons) == (
            episodes_per_cycle,
            {3: episodes_per_cycle},
            {"done": episodes_per_cycle},
        )
        assert stats.action_tokens == sum(len(a) for turns in episodes for _, a in turns)
        # observation tokens: the first prompt, then what each prompt adds to the transcript
        observed = 0
        for turns in episodes:
            observed += len(turns[0][0])
            for (prompt, action), (following, _) in zip(turns, turns[1:], strict=False):
                observed += len(following) - len(prompt) - len(action)
        assert stats.observation_tokens == observed
        assert [record.episodes for record in stats.turn_records] == [episodes_per_cycle] * 3
        assert [record.action_tokens for record in stats.turn_records] == [episodes_per_cycle] * 3
        assert line["episodes"]["turns_per_episode"] == 3.0
    # the cycle artifact has the turns; inspect finds them in the data directory
    cycles = subflow_runs(state.state_details.flow_run_id)
    markdown, metrics = cycle_artifact(cycles[1].id)
    assert "## Turns" in markdown and "| 0 | 2 |" in markdown
    assert (
        main(
            [
                "inspect",
                result.run_id,
                "--data-dir",
                str(whitney.data_dir),
                "--cycle",
                "1",
                "--json",
            ]
        )
        == 0
    )
    (group,) = json.loads(capsys.readouterr().out)["groups"]
    assert [(block["turn"], block["sequences"]) for block in group["turns"]] == [
        (0, 6),
        (1, 6),
        (2, 6),
    ]
    assert group["turns"][0]["samples"] == 2  # a request per group
    assert (
        main(["inspect", result.run_id, "--data-dir", str(whitney.data_dir), "--cycle", "1"]) == 0
    )
    assert "sample (turn 2)" in capsys.readouterr().out


def test_the_same_adapter_twice_one_by_one_and_after_a_replayed_cycle(
    whitney: EmbeddedWhitney, quiz_config: RLConfig
) -> None:
    """The same config twice, its turns submitted one by one, and a cycle that failed after
    its second turn and replayed from the journal: one adapter sha256."""
    first = rl_flow(quiz_config)
    again = rl_flow(quiz_config)
    one_by_one = rl_flow(
        quiz_config.model_copy(update={"pipelined": False, "concurrent_sampling": False})
    )
    assert first.adapter.sha256 == again.adapter.sha256 == one_by_one.adapter.sha256
    assert [c.reward_mean for c in first.cycles] == [c.reward_mean for c in one_by_one.cycles]
    flowtest_multiturn.QuizFailingOnce.failed.clear()
    config = quiz_config.model_copy(update={"env": "flowtest_multiturn:QuizFailingOnce"})
    state = rl_flow(config, return_state=True)
    replayed = state.result()
    assert flowtest_multiturn.QuizFailingOnce.failed.is_set()
    assert replayed.adapter.sha256 == first.adapter.sha256
    assert_executed_once_in_order(whitney, replayed.run_id)  # the replay ran nothing again
    cycles = subflow_runs(state.state_details.flow_run_id)
    assert [run.run_count for run in cycles] == [2, 1]


def test_limits_cut_episodes_as_configured(whitney: EmbeddedWhitney, quiz_config: RLConfig) -> None:
    one_cycle = quiz_config.model_copy(update={"cycles": 1, "max_tokens": 6})
    two_turns = rl_flow(one_cycle.model_copy(update={"rollout": RolloutSettings(max_turns=2)}))
    stats = two_turns.cycles[0].episodes
    assert (stats.turns, stats.stop_reasons) == ({2: 6}, {"max_turns": 6})
    episodes = episodes_in_journal(journal_rows(whitney, two_turns.run_id))
    earned = [quiz_reward(turns) for turns in episodes]  # the 2 turns' scores, out of 3
    assert two_turns.cycles[0].reward_mean == pytest.approx(statistics.fmean(earned))
    fixed = rl_flow(
        one_cycle.model_copy(update={"rollout": RolloutSettings(max_turns=2, limit_reward=-1)})
    )
    assert fixed.cycles[0].reward_mean == -1.0
    # the steady tool's "Tool: " (7 tokens with BOS) leaves 3 of 10: max_tokens 6 becomes 3,
    # and " ok\nTool: " leaves no room for a second turn
    tokens = rl_flow(
        one_cycle.model_copy(
            update={
                "env": "flowtest_multiturn:SteadyTool",
                "rollout": RolloutSettings(max_episode_tokens=10),
            }
        )
    )
    assert tokens.cycles[0].episodes.stop_reasons == {"episode_tokens": 6}
    rows = [row for row in journal_rows(whitney, tokens.run_id) if row["kind"] == "sample"]
    assert [json.loads(row["payload"])["sampling_params"]["max_tokens"] for row in rows] == [3, 3]
    timed = rl_flow(
        one_cycle.model_copy(
            update={
                "env": "flowtest_multiturn:SlowQuiz",
                "prompts_per_cycle": 1,
                "group_size": 2,
                "rollout": RolloutSettings(episode_timeout_s=0.15),
            }
        )
    )
    assert timed.cycles[0].episodes.stop_reasons == {"time": 2}  # each step takes 0.2 s
    assert timed.cycles[0].episodes.turns == {1: 2}


def tool_config(quiz_config: RLConfig, policy: str, **rollout: Any) -> RLConfig:
    return quiz_config.model_copy(
        update={
            "env": "flowtest_multiturn:FlakyTool",
            "prompts_per_cycle": 3,
            "group_size": 4,
            "rollout": RolloutSettings(failure_policy=policy, **rollout),
        }
    )


def failures_by_hand(
    config: RLConfig, cycle: int, retries: int = 0
) -> tuple[int, list[tuple[int, int]]]:
    """How many of the cycle's episode attempts fail for good, and which episodes still fail
    after `retries` more attempts, by hand: attempt a of episode (g, m) is in draw a, its
    seed derived from (seed, cycle, a, g, m)."""
    failing = [
        (group, member)
        for group in range(config.prompts_per_cycle)
        for member in range(config.group_size)
        if fails_for_good(derive_seed(config.seed, cycle, 0, group, member))
    ]
    failed = len(failing)
    for draw in range(1, retries + 1):
        failing = [
            (group, member)
            for group, member in failing
            if fails_for_good(derive_seed(config.seed, cycle, draw, group, member))
        ]
        failed += len(failing)
    return failed, failing


def test_a_flaky_tool_trains_to_the_end_under_retry_episode(quiz_config: RLConfig) -> None:
    config = tool_config(quiz_config, "retry_episode", episode_retries=4)
    state = rl_flow(config, return_state=True)
    result = state.result()
    assert len(result.cycles) == 2
    for cycle in result.cycles:
        failed, still_failing = failures_by_hand(config, cycle.cycle, retries=4)
        assert still_failing == []
        stats = cycle.episodes
        assert (stats.failed, stats.retried) == (failed, failed)
        assert stats.stop_reasons["done"] == config.prompts_per_cycle * config.group_size
        assert stats.dropped == stats.groups_failed == cycle.groups_dropped == 0
    assert sum(c.episodes.failed for c in result.cycles) > 0
    # the tool's calls are task runs of the cycle, by episode and turn; some were retried
    cycle_0 = subflow_runs(state.state_details.flow_run_id)[0]
    runs = task_runs_of(cycle_0.id, expected=60)
    names = {run.name for run in runs}
    assert "env_start[episode=0.0]" in names
    assert f"env_step[episode=1.2, turn={TOOL_TURNS - 1}]" in names or any(
        name.startswith("env_step[episode=1.2/a") for name in names
    )
    assert any(run.name.startswith("env_") and run.run_count > 1 for run in runs)


def test_min_viable_group_drops_the_groups_with_too_few_successes(quiz_config: RLConfig) -> None:
    config = tool_config(quiz_config, "min_viable_group", min_viable_share=0.75).model_copy(
        update={"cycles": 1}
    )
    result = rl_flow(config)
    needed = math.ceil(0.75 * config.group_size)
    for cycle in result.cycles:
        failed, failing = failures_by_hand(config, cycle.cycle)
        succeeded = [
            config.group_size - sum(group == index for group, _ in failing)
            for index in range(config.prompts_per_cycle)
        ]
        stats = cycle.episodes
        assert stats.failed == failed
        assert stats.groups_failed == sum(count < needed for count in succeeded)
        assert stats.dropped == sum(
            config.group_size - count if count >= needed else config.group_size
            for count in succeeded
        )
        assert cycle.groups_dropped == stats.groups_failed
    assert sum(c.episodes.groups_failed for c in result.cycles) > 0


def test_fail_fast_fails_the_flow_naming_the_episode(quiz_config: RLConfig) -> None:
    config = tool_config(quiz_config, "fail_fast").model_copy(update={"cycle_retries": 0})
    assert failures_by_hand(config, 0)[0] > 0
    with pytest.raises(EpisodeFailed, match=r"episode \d+\.\d+ failed at .*ToolDown"):
        rl_flow(config)


def test_tool_calls_time_out_and_run_at_most_concurrency_at_once(quiz_config: RLConfig) -> None:
    tool = flowtest_multiturn.CountingTool
    tool.hung.clear()
    tool.most = 0
    config = quiz_config.model_copy(
        update={"env": "flowtest_multiturn:CountingTool", "cycles": 1, "prompts_per_cycle": 2}
    )
    result = rl_flow(config)
    assert tool.hung.is_set()  # the first step hung past its timeout, and was retried
    assert result.cycles[0].episodes.stop_reasons == {"done": 6}
    assert tool.most == tool.io.concurrency


def test_max_staleness_is_refused_for_a_multi_turn_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Sampling ahead needs a later cycle's requests before its samples' answers exist; a
    turn's prompt holds the environment's answer to the turn before: refused, naming the
    field, before anything is allocated."""
    with pytest.raises(ConfigError, match="multi-turn") as refused:
        check_rl_config(RLConfig(env="quiz", max_staleness=1))
    assert refused.value.field == "max_staleness"
    assert main(["run", "rl", "--env", "quiz", "--max-staleness", "1"]) == 2
    assert "max_staleness" in capsys.readouterr().err


def test_evaluation_is_refused_for_a_multi_turn_environment() -> None:
    """Evaluation samples one completion per held-out prompt: the RL flow's inline one and
    evaluate-checkpoint's eval set refuse a multi-turn environment, naming the field."""
    with pytest.raises(ConfigError, match="multi-turn") as refused:
        check_rl_config(RLConfig(env="quiz", eval_every=5))
    assert refused.value.field == "eval_every"
    with pytest.raises(ConfigError, match="multi-turn") as refused:
        load_eval_plan(EvalSettings(env="quiz"), RawRenderer(ByteTokenizer()))
    assert refused.value.field == "env"
