"""Judged rewards (flows.rl.judge, docs/judge.md): a judge model on a frozen run grades the
policy's completions. Its score is checked against logprobs the test asks Whitney for itself;
a few cycles run with each mode; a retried cycle replays to the same adapter and asks the judge
nothing twice; a bad judge setting is refused naming its field."""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
from flowtest_cli import Refusal
from flowtest_helpers import assert_executed_once_in_order, subflow_runs, task_runs_of
from flowtest_recipe_helpers import (
    auxiliary_run_id,
    journaled,
    replay_after_second_forward_backward,
)

from flows.core.config import read_config_file, validated
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.judge import JUDGE_TAG
from flows.rl.judge_config import JudgeSettings
from flows.rl.judge_rubric import Rubric
from flows.rl.plan import check_rl_config
from tasks import operations
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney
from whitney.renderers import get_renderer
from whitney.tokenizers import BOS_ID, ByteTokenizer

EOS = 257
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "judge-rubric.toml"
JUDGE = "local/tiny"


def judged(config: RLConfig, tmp_path: Path, **settings: Any) -> RLConfig:
    """`config` rewarded by a local/tiny judge whose answers are cached under `tmp_path`."""
    judge = JudgeSettings(model=JUDGE, cache_dir=str(tmp_path / "judge"), **settings)
    return config.model_copy(update={"judge": judge})


def completion_texts_of(rows: list[dict]) -> list[list[str]]:
    """The text of every completion of the policy's sample calls `rows`, by group: its bytes
    before EOS, decoded as UTF-8 (a bad byte replaced)."""
    groups = []
    for row in rows:
        texts = []
        for sequence in json.loads(row["result"])["sequences"]:
            tokens = sequence["tokens"]
            tokens = tokens[: tokens.index(EOS)] if EOS in tokens else tokens
            texts.append(bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace"))
        groups.append(texts)
    return groups


def test_logprobs_score_is_the_judges_odds_of_yes(
    whitney: EmbeddedWhitney,
    small_config: RLConfig,
    inspector: WhitneyClient,
    tmp_path: Path,
) -> None:
    config = judged(small_config.model_copy(update={"cycles": 1}), tmp_path)
    state = rl_flow(config, return_state=True)
    result = state.result()
    prompts = check_rl_config(config).sample_requests(0)[0]  # the environment's, digits
    groups = completion_texts_of(
        journaled(whitney, result.run_id, "sample")[: config.prompts_per_cycle]
    )
    # by hand: BOS and the question's bytes, then "Yes" or "No", on a fresh run of the judge's
    # base model (the frozen judge's weights): P(Yes) / (P(Yes) + P(No))
    session = inspector.open_session()
    run = inspector.create_run(session.session_id, "local", JUDGE, seed=config.seed)
    sampler = "by-hand"
    inspector.run_operation(run.run_id, "save_weights_for_sampler", {"name": sampler})
    rewards = []
    for prompt, texts in zip(prompts, groups, strict=True):
        for text in texts:
            question = (
                "Is the reply a good answer to the request?\n\n"
                f"Request: {prompt}\nReply: {text}\n\nAnswer Yes or No:"
            )
            tokens = [BOS_ID, *question.encode()]
            sequences = [{"token_ids": tokens + list(answer)} for answer in (b"Yes", b"No")]
            answer = inspector.sampler_operation(
                run.run_id, sampler, "logprobs", {"sequences": sequences}
            )
            yes, no = (sum(row[len(tokens) :]) for row in answer["logprobs"])
            rewards.append(math.exp(yes) / (math.exp(yes) + math.exp(no)))
    inspector.cancel(run.run_id)
    inspector.close_session(session.session_id)
    assert len(set(rewards)) > 1  # the judge tells the completions apart
    assert result.cycles[0].reward_mean == pytest.approx(statistics.fmean(rewards), abs=1e-6)
    # every judge call is a task run tagged for a Prefect tag concurrency limit
    (cycle,) = subflow_runs(state.state_details.flow_run_id)
    asked = len(journaled(whitney, auxiliary_run_id(inspector, result.session_id, result.run_id)))
    tasks = task_runs_of(cycle.id, expected=asked - 1 + config.prompts_per_cycle + 2)
    judge_tasks = [task for task in tasks if JUDGE_TAG in task.tags]
    assert len(judge_tasks) == asked - 1  # all but the publication, outside the cycle
    assert {task.name.split("[")[0] for task in judge_tasks} == {"logprobs"}


def judge_answers(server: EmbeddedWhitney, judge_run: str) -> dict[str, str]:
    """The judge's sampled answers by question (both as text: bytes before EOS)."""
    answers = {}
    for row in journaled(server, judge_run, "sample"):
        question = bytes(row["payload"]["prompt"]["token_ids"][1:]).decode()
        (sequence,) = json.loads(row["result"])["sequences"]
        tokens = sequence["tokens"]
        tokens = tokens[: tokens.index(EOS)] if EOS in tokens else tokens
        answers[question] = bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
    return answers


DIGITS = {str(digit): digit / 9 for digit in range(10)}


def verdict_by_hand(answer: str) -> float:
    """choices: a digit d is worth d / 9; the first digit in the answer, else unparsed 0.5."""
    digits = [character for character in answer if character in DIGITS]
    return DIGITS[digits[0]] if digits else 0.5


def group_by_hand(answer: str, size: int) -> list[float]:
    """Reply k's first `k: score` (at most 10) / 10, else unparsed 0.5."""
    scores: dict[int, float] = {}
    for number, score in re.findall(r"(\d+)\s*[:=.)-]\s*(\d+(?:\.\d+)?)", answer):
        scores.setdefault(int(number), min(float(score), 10.0))
    return [scores[k] / 10 if k in scores else 0.5 for k in range(1, size + 1)]


@pytest.mark.parametrize("mode", ["verdict", "group"])
def test_sampled_verdicts_reward_a_few_cycles(
    whitney: EmbeddedWhitney,
    small_config: RLConfig,
    inspector: WhitneyClient,
    tmp_path: Path,
    mode: str,
) -> None:
    config = judged(
        small_config.model_copy(update={"cycles": 2}),
        tmp_path,
        mode=mode,
        choices=DIGITS,
        unparsed_reward=0.5,
        temperature=1.0,
        max_tokens=32,
    )
    result = rl_flow(config)
    plan = check_rl_config(config)
    judge_run = auxiliary_run_id(inspector, result.session_id, result.run_id)
    answers = judge_answers(whitney, judge_run)
    rows = journaled(whitney, judge_run, "sample")
    assert {row["payload"]["sampling_params"]["temperature"] for row in rows} == {1.0}
    assert all(row["payload"]["sampling_params"]["seed"] is not None for row in rows)
    samples = config.prompts_per_cycle
    policy_rows = journaled(whitney, result.run_id, "sample")
    graded: list[float] = []
    for cycle in result.cycles:
        prompts = plan.sample_requests(cycle.cycle)[0]
        first = cycle.cycle * samples
        groups = completion_texts_of(policy_rows[first : first + samples])
        rewards = []
        for prompt, texts in zip(prompts, groups, strict=True):
            if mode == "verdict":
                for text in texts:
                    question = (
                        "Is the reply a good answer to the request?\n\n"
                        f"Request: {prompt}\nReply: {text}\n\nAnswer {' or '.join(DIGITS)}:"
                    )
                    rewards.append(verdict_by_hand(answers[question]))
            else:
                replies = "\n".join(f"Reply {k}: {t}" for k, t in enumerate(texts, start=1))
                question = (
                    f"Is the reply a good answer to the request?\n\nRequest: {prompt}\n\n"
                    f"{replies}\n\nScore every reply from 0 to 10, one line each, as "
                    "`number: score`:"
                )
                rewards += group_by_hand(answers[question], len(texts))
        assert cycle.reward_mean == pytest.approx(statistics.fmean(rewards), abs=1e-9)
        graded += rewards
    # the tiny judge answers random bytes: a digit among them grades, none is unparsed
    assert mode == "group" or len(set(graded)) > 2
    assert_executed_once_in_order(whitney, judge_run)


def test_a_retried_cycle_replays_and_asks_the_judge_nothing_twice(
    whitney: EmbeddedWhitney,
    small_config: RLConfig,
    inspector: WhitneyClient,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    config = judged(small_config.model_copy(update={"cycles": 2, "prompts_per_cycle": 2}), tmp_path)
    sent: list[tuple[str, int]] = []  # every judge call sent: (judge run, seq id)
    execute = operations.execute_operation

    signature = inspect.signature(execute)

    @functools.wraps(execute)
    def counting(*args: Any, **options: Any) -> Any:
        call = signature.bind(*args, **options).arguments
        if call["kind"] == "logprobs":  # the policy's calls here are sample and training only
            sent.append((call["run_id"], call["seq_id"]))
        return execute(*args, **options)

    monkeypatch.setattr(operations, "execute_operation", counting)
    # cycle 1 fails after its forward_backward, once its judge calls are answered
    undisturbed, _, result, _ = replay_after_second_forward_backward(config, monkeypatch)
    judge_run = auxiliary_run_id(inspector, result.session_id, result.run_id)
    calls = [seq_id for run_id, seq_id in sent if run_id == judge_run]
    rows = assert_executed_once_in_order(whitney, judge_run)
    assert len(calls) == len(set(calls)) == len(rows) - 1  # all but the sampler's publication
    undisturbed_judge = auxiliary_run_id(inspector, undisturbed.session_id, undisturbed.run_id)
    assert len(calls) == sum(run_id == undisturbed_judge for run_id, _ in sent)
    # the retried cycle's record counts its judge answers once, as the undisturbed one does
    assert [cycle.usage for cycle in result.cycles] == [cycle.usage for cycle in undisturbed.cycles]


def test_the_judge_example_is_a_config_with_a_judge() -> None:
    data = read_config_file(EXAMPLE)
    config = validated(RLConfig, data)
    assert config.model_dump(exclude_unset=True).keys() == data.keys()
    assert config.judge.enabled and config.judge.mode == "logprobs"


JUDGE_TABLE = '[judge]\nmodel = "local/tiny"\n'


@pytest.mark.parametrize(
    ("arguments", "config", "field", "needle"),
    [
        ([], '[judge]\nmodel = "local/huge"\n', "judge.model", "'local/huge' is not a base"),
        ([], JUDGE_TABLE + "choices = {Yes = 1.0}\n", "judge.choices", "at least two"),
        ([], JUDGE_TABLE + 'template = "{prompt}"\n', "judge.template", "needs {completion}"),
        (
            [],
            JUDGE_TABLE + 'template = "{prompt} {completion} {grade}"\n',
            "judge.template",
            "KeyError: 'grade'",
        ),
        ([], JUDGE_TABLE + 'mode = "ranking"\n', "judge.mode", "Input should be"),
        (["--env", "quiz"], JUDGE_TABLE, "judge.model", "multi-turn environment"),
        ([], JUDGE_TABLE + 'renderer = "llama3"\n', "judge.renderer", "llama3"),
    ],
)
def test_a_bad_judge_setting_exits_2_naming_the_field(
    arguments: list[str],
    config: str,
    field: str,
    needle: str,
    tmp_path: Path,
    refused: Refusal,
) -> None:
    (tmp_path / "rl.toml").write_text(config)
    refused("rl", [*arguments, "--config", str(tmp_path / "rl.toml")], field, needle)


def answered(text: str) -> dict:
    """A sample result whose one sequence is `text`'s bytes and EOS."""
    return {"sequences": [{"tokens": [*text.encode(), EOS], "stop_reason": "stop"}]}


def test_answers_become_rewards_as_the_docs_say() -> None:
    renderer = get_renderer("raw", ByteTokenizer(), JUDGE)
    settings = JudgeSettings(
        model=JUDGE, mode="verdict", choices={"Yes": 1.0, "Yes!": 0.5, "No": 0.0}
    )
    rubric = Rubric(JUDGE, settings, renderer, seed=0)
    assert rubric.verdict_reward("Well... No, Yes") == 0.0  # the label found first
    assert rubric.verdict_reward("Yes! indeed") == 0.5  # the longer at a tie
    assert rubric.verdict_reward("maybe") == 0.0  # unparsed_reward
    group = Rubric(JUDGE, JudgeSettings(model=JUDGE, mode="group", scale=10), renderer, 0)
    answer = answered("1: 7\n2 = 12\n3) 4.5\n1: 2")
    assert group.group_rewards(answer, 4) == [0.7, 1.0, 0.45, 0.0]
    logprobs = Rubric(JUDGE, JudgeSettings(model=JUDGE, choices={"A": 1.0, "B": 0.25}), renderer, 0)
    question = logprobs.item_question("2+2?", "4")
    before = [None] + [-3.0] * (question.question_tokens - 1)  # the question: left out
    rows = {"logprobs": [before + [-1.0], before + [-2.0]]}  # "A", "B": one byte each
    odds = math.exp(-1.0) / (math.exp(-1.0) + math.exp(-2.0))
    assert logprobs.item_reward(question, rows) == pytest.approx(odds + 0.25 * (1 - odds))
