"""Inline evaluation of the RL flow (`eval_every`): it changes nothing training computes (the
adapter sha256 with and without it is the same), its operations are ordered and replay when
the cycle fails in the middle of them, and its numbers are those a hand computation gets from
the samples the server journaled (digits' reward written out here, pass@k by its
definition). They are in the metrics line, the cycle's table and the summary's picture."""

from __future__ import annotations

import base64
import json
import re
import statistics
import struct

import pytest
from flowtest_helpers import (
    artifacts_of,
    assert_executed_once_in_order,
    cycle_artifact,
    subflow_runs,
)
from flowtest_recipe_helpers import journaled, replay_after_one_failure

from flows.core.environments.digits import DigitsEnvironment
from flows.core.records.inspection_journal import cycle_groups
from flows.core.records.run_records import metrics_row
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.plan import check_rl_config
from tasks import operations
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney
from whitney.tokenizers import BOS_ID, EOS_ID

EVAL_PROMPTS = DigitsEnvironment.EVAL_PROMPTS


def digits_reward(tokens: list[int]) -> float:
    """The digits environment's reward, by hand: 1.0 for a number, else half the share of
    digit characters (the completion's bytes before EOS)."""
    text = bytes(token for token in tokens if token < 256).decode("utf-8", errors="replace")
    if not text:
        return 0.0
    share = sum(character in "0123456789" for character in text) / len(text)
    return 1.0 if share == 1.0 else 0.5 * share


def is_eval_greedy(kind: str, payload: dict) -> bool:
    return kind == "sample" and payload["sampling_params"].get("top_k") == 1


def test_inline_evaluation_changes_nothing_and_replays(
    whitney: EmbeddedWhitney,
    small_config: RLConfig,
    inspector: WhitneyClient,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,
) -> None:
    config = small_config.model_copy(update={"cycles": 3, "checkpoint_every": 1})
    without = rl_flow(config)
    metrics_path = tmp_path / "metrics.jsonl"
    evaluated = config.model_copy(update={"eval_every": 2, "metrics_path": str(metrics_path)})
    # the second greedy eval sample's answer is followed by a failure: cycle 2 (the last, with
    # an evaluation after it) fails in its evaluation, is retried and replays
    undisturbed, state, result, matched = replay_after_one_failure(
        evaluated,
        monkeypatch,
        is_eval_greedy,
        len(EVAL_PROMPTS) + 2,
        owner=operations,
        name="execute_operation",
    )
    assert result.adapter.sha256 == undisturbed.adapter.sha256 == without.adapter.sha256
    for field in ("reward_mean", "loss", "grad_norm", "tokens_sampled", "tokens_trained"):
        expected = [getattr(cycle, field) for cycle in without.cycles]
        assert [getattr(cycle, field) for cycle in result.cycles] == expected, field
    assert [cycle.checkpoint for cycle in result.cycles][:2] == [
        f"whitney://runs/{result.run_id}/states/cycle-{n}" for n in (0, 1)
    ]
    assert [cycle.eval is not None for cycle in result.cycles] == [False, True, True]
    for replayed, first in zip(result.cycles, undisturbed.cycles, strict=True):
        if first.eval is not None:
            exclude = {"seconds"}
            assert replayed.eval.model_dump(exclude=exclude) == first.eval.model_dump(
                exclude=exclude
            )
    failed = matched[len(EVAL_PROMPTS) + 1]
    assert matched.count(failed) == 2  # the replay sent the failed sample again, same seq id
    rows = assert_executed_once_in_order(whitney, result.run_id)
    cycles = subflow_runs(state.state_details.flow_run_id)
    assert [run.run_count for run in cycles] == [1, 1, 2]

    # the journal: after cycle n's tail, eval-n and its 2 x 8 samples, then cycle n+1
    operations_ = inspector.journal(result.run_id, limit=1000)
    names = [(op.kind, (op.result or {}).get("sampler_id")) for op in operations_]
    assert ("save_weights_for_sampler", "eval-1") in names
    assert ("save_weights_for_sampler", "eval-2") in names
    assert ("save_weights_for_sampler", "eval-0") not in names
    groups = {group.label: group for group in cycle_groups(operations_)}
    assert groups["eval-1"].cycle == 1 and groups["eval-2"].cycle == 2
    assert [op.kind for op in groups["eval-1"].operations] == ["save_weights_for_sampler"] + [
        "sample"
    ] * (2 * len(EVAL_PROMPTS))
    assert {op.sampler_id for op in groups["cycle 2"].operations if op.kind == "sample"} == {
        "cycle-2"
    }
    assert rows[-1]["kind"] == "export_lora"

    # the numbers, by hand from the journaled requests and answers
    samples = {row["seq_id"]: row for row in journaled(whitney, result.run_id, "sample")}
    for cycle in (1, 2):
        ops = [op for op in groups[f"eval-{cycle}"].operations if op.kind == "sample"]
        greedy, drawn = ops[: len(EVAL_PROMPTS)], ops[len(EVAL_PROMPTS) :]
        for op, prompt in zip(greedy + drawn, EVAL_PROMPTS + EVAL_PROMPTS, strict=True):
            payload = samples[op.seq_id]["payload"]
            assert payload["prompt"]["token_ids"] == [BOS_ID, *prompt.encode()]
            assert payload["sampling_params"]["stop_token_ids"] == [EOS_ID]
        assert {samples[op.seq_id]["payload"]["num_samples"] for op in greedy} == {1}
        assert {samples[op.seq_id]["payload"]["sampling_params"]["top_k"] for op in greedy} == {1}
        drawn_params = [samples[op.seq_id]["payload"] for op in drawn]
        assert {p["num_samples"] for p in drawn_params} == {config.group_size}
        assert {p["sampling_params"]["top_k"] for p in drawn_params} == {None}
        assert {p["sampling_params"]["temperature"] for p in drawn_params} == {config.temperature}
        best = [digits_reward(op.result["sequences"][0]["tokens"]) for op in greedy]
        rewards = [[digits_reward(s["tokens"]) for s in op.result["sequences"]] for op in drawn]
        measured = result.cycles[cycle].eval
        assert measured.reward_mean == pytest.approx(statistics.fmean(best), abs=1e-12)
        assert measured.sampled_reward_mean == pytest.approx(
            statistics.fmean(r for group in rewards for r in group), abs=1e-12
        )
        assert measured.pass_at_k == statistics.fmean(max(group) == 1.0 for group in rewards)
        assert (measured.k, measured.prompts, measured.loss) == (config.group_size, 8, None)

    # the records: a nested `eval` object in the metrics line, `eval.*` rows in the table
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()][3:]  # 2nd run
    assert [line["eval"] is not None for line in lines] == [False, True, True]
    assert lines[2]["eval"]["pass_at_k"] == result.cycles[2].eval.pass_at_k
    markdown, _ = cycle_artifact(cycles[1].id)
    table = dict(re.findall(r"^\| (eval\.\w+) \| ([^|]*) \|$", markdown, re.MULTILINE))
    assert float(table["eval.reward_mean"]) == pytest.approx(result.cycles[1].eval.reward_mean)
    assert float(table["eval.pass_at_k"]) == pytest.approx(result.cycles[1].eval.pass_at_k)

    # the summary's learning curves: the PNG beside the metrics file, reward, eval and loss
    (summary,) = [a for a in artifacts_of(state.state_details.flow_run_id) if a.type == "markdown"]
    (data,) = re.findall(r"\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", summary.data)
    png = base64.b64decode(data)
    assert png == metrics_path.with_suffix(".png").read_bytes()
    assert struct.unpack(">II", png[16:24]) == (960, 600)  # IHDR: 3 panels, two to a row


def test_inline_evaluation_off_policy_changes_nothing(small_config: RLConfig) -> None:
    """With max_staleness 1 (the later cycle's samples requested ahead, on the sampler lane),
    an evaluation after every cycle leaves the schedule and the adapter as they were."""
    config = small_config.model_copy(update={"cycles": 2, "max_staleness": 1})
    without = rl_flow(config)
    evaluated = rl_flow(config.model_copy(update={"eval_every": 1}))
    assert evaluated.adapter.sha256 == without.adapter.sha256
    # cycle 0 requested cycle 1's samples on its sampler, then was evaluated on eval-0
    assert [cycle.staleness for cycle in evaluated.cycles] == [0, 1]
    assert [cycle.sampler_id for cycle in evaluated.cycles] == ["cycle-0", "cycle-0"]
    for field in ("reward_mean", "loss", "grad_norm", "sampler_id", "staleness"):
        expected = [getattr(cycle, field) for cycle in without.cycles]
        assert [getattr(cycle, field) for cycle in evaluated.cycles] == expected, field
    assert [cycle.eval is not None for cycle in evaluated.cycles] == [True, True]


def test_evaluation_at_start_is_the_base_model_before_any_training(
    whitney: EmbeddedWhitney, small_config: RLConfig, inspector: WhitneyClient
) -> None:
    """eval_at_start: the first cycle evaluates the weights before it trains (on `eval-start`,
    ahead of its sampler); the answers are those of the base model on a fresh run of its own,
    and training is the same as without it."""
    config = small_config.model_copy(update={"cycles": 2})
    without = rl_flow(config)
    result_config = config.model_copy(update={"eval_at_start": True})
    result = rl_flow(result_config)
    assert result.adapter.sha256 == without.adapter.sha256
    for field in ("reward_mean", "loss", "tokens_sampled", "tokens_trained"):
        expected = [getattr(cycle, field) for cycle in without.cycles]
        assert [getattr(cycle, field) for cycle in result.cycles] == expected, field
    assert [cycle.eval for cycle in result.cycles] == [None, None]
    assert [cycle.eval_before is not None for cycle in result.cycles] == [True, False]

    operations_ = inspector.journal(result.run_id, limit=1000)
    first = operations_[0]
    assert (first.kind, first.result["sampler_id"]) == ("save_weights_for_sampler", "eval-start")
    evaluated = [op for op in operations_ if op.kind == "sample" and op.sampler_id == "eval-start"]
    assert max(op.seq_id for op in evaluated) < min(
        op.seq_id for op in operations_ if op.sampler_id == "cycle-0"
    )

    # the same requests on the base model: a fresh run's sampler (its adapter is zero)
    session = inspector.open_session({"test": "eval-at-start"}).session_id
    run_id = inspector.create_run(session, config.provider, config.base_model, seed=99).run_id
    sampler = inspector.run_operation(run_id, "save_weights_for_sampler", {})["sampler_id"]
    greedy, sampled = check_rl_config(result_config).evaluation.requests()
    rows = journaled(whitney, result.run_id, "sample")
    payloads = {row["seq_id"]: row["payload"] for row in rows}
    assert [payloads[op.seq_id] for op in evaluated] == greedy + sampled
    base = [
        inspector.sampler_operation(run_id, sampler, "sample", request)
        for request in greedy + sampled
    ]
    inspector.close_session(session)
    assert [answer["sequences"] for answer in base] == [op.result["sequences"] for op in evaluated]
    measured = result.cycles[0].eval_before
    best = base[: len(EVAL_PROMPTS)]
    expected = statistics.fmean(digits_reward(a["sequences"][0]["tokens"]) for a in best)
    assert measured.reward_mean == pytest.approx(expected, abs=1e-12)
    assert (measured.k, measured.prompts) == (config.group_size, len(EVAL_PROMPTS))
    row = metrics_row(result.cycles[0])
    assert row["eval_before.reward_mean"] == pytest.approx(expected, abs=1e-6)
    assert "eval_before" not in metrics_row(result.cycles[1])
