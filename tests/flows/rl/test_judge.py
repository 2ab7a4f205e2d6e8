"""Judged rewards (flows.rl.judge, docs/judge.md): a judge model on a frozen run grades the
policy's completions. Its score is checked against logprobs the test asks Whitney for itself;
a few cycles run with each mode; a retried cycle replays to the same adapter and asks the judge
nothing twice; a bad judge setting is refused naming its field."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from flowtest_cli import Refusal
from flowtest_helpers import assert_executed_once_in_order
from flowtest_recipe_helpers import journaled, replay_after_one_failure

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.judge_config import JudgeSettings
from flows.rl.plan import check_rl_config
from tasks import operations
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney
from whitney.tokenizers import BOS_ID

EOS = 257
JUDGE = "local/tiny"


def judged(config: RLConfig, tmp_path: Path, **settings: Any) -> RLConfig:
    """`config` rewarded by a local/tiny judge whose answers are cached under `tmp_path`."""
    judge = JudgeSettings(model=JUDGE, cache_dir=str(tmp_path / "judge"), **settings)
    return config.model_copy(update={"judge": judge})


def judge_run_id(inspector: WhitneyClient, session_id: str, policy_run_id: str) -> str:
    (judge,) = [
        run_id
        for run_id in inspector.get_session(session_id).run_ids or []
        if run_id != policy_run_id
    ]
    return judge


def completion_texts(server: EmbeddedWhitney, run_id: str, samples: int) -> list[list[str]]:
    """The text of every completion of the policy's first `samples` sample calls, by group:
    its bytes before EOS, decoded as UTF-8 (a bad byte replaced)."""
    groups = []
    for row in journaled(server, run_id, "sample")[:samples]:
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
    result = rl_flow(config)
    prompts = check_rl_config(config).sample_requests(0)[0]  # the environment's, digits
    groups = completion_texts(whitney, result.run_id, config.prompts_per_cycle)
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
