"""docs/bring-your-own-task.md's examples (examples/byo/), each run as the guide says, by the
console script from the repository root, briefly (local/tiny, 2 cycles) on the suite's
embedded server, then checked against the server's journal by computations written here: the
environments' rewards from the sampled text, the multi-turn transcripts the server received,
the loss recipe's loss by hand, DPO's first loss, and that SFT and DPO learned."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowtest_cli import assert_refused_before_any_session, console_environment, run_ok
from prefect.testing.utilities import prefect_test_harness

from flows.core.config import ConfigError, read_config_file, validated
from flows.core.environments import Completion
from flows.core.environments.digits import DigitsEnvironment
from flows.rl.config import RLConfig
from flows.rl.plan import compose_recipe
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney
from whitney.wire import Operation

ROOT = Path(__file__).resolve().parents[2]
BYO = ROOT / "examples" / "byo"
CONSOLE_SCRIPT = Path(sys.executable).with_name("whitney-flows")
RUN_ID = re.compile(r"Whitney run\s*│\s*(run-[0-9a-f]+)")
EOS = 257


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[None]:
    """One temporary Prefect API for this module's runs."""
    with prefect_test_harness(server_startup_timeout=180):
        yield


Run = tuple[list[dict[str, Any]], list[Operation], dict[int, dict[str, Any]]]
"""A run's metrics line per cycle, its journal, and each operation's payload by seq id."""


def run_example(
    server: EmbeddedWhitney, tmp_path: Path, flow: str, config: str, *arguments: str
) -> Run:
    """`whitney-flows run FLOW --config examples/byo/CONFIG ARGUMENTS` from the repository root
    on `server`, the examples importable as the guide says (PYTHONPATH=examples/byo); the
    payloads as the server journaled them (its SQLite journal, read-only)."""
    metrics = tmp_path / "metrics.jsonl"
    environment = console_environment(tmp_path / "data")
    environment |= {"PYTHONPATH": f"{ROOT}:{BYO}", "WHITNEY_API_KEY": server.api_keys[0]}
    argv = [str(CONSOLE_SCRIPT), "run", flow, "--config", f"examples/byo/{config}", *arguments]
    argv += ["--api-url", server.url, "--metrics-out", str(metrics)]
    argv += ["--adapter-dir", str(tmp_path / "adapters")]
    output = run_ok(argv, ROOT, environment, timeout=400)
    run_id = RUN_ID.search(output)
    assert run_id, output
    with WhitneyClient(server.url, server.api_keys[0]) as client:
        journal = list(client.iter_journal(run_id[1]))
    database = f"file:{Path(server.data_dir) / 'journal.sqlite3'}?mode=ro"
    with sqlite3.connect(database, uri=True) as connection:
        rows = connection.execute(
            "SELECT seq_id, payload FROM operations WHERE run_id=?", (run_id[1],)
        ).fetchall()
    payloads = {seq_id: json.loads(payload) for seq_id, payload in rows}
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return records, journal, payloads


def in_cycle(journal: list[Operation], record: dict[str, Any], kind: str) -> list[Operation]:
    """The operations of `kind` in the record's cycle, in seq order."""
    return [
        op
        for op in journal
        if op.kind == kind and record["seq_start"] <= op.seq_id < record["seq_end"]
    ]


def text(tokens: list[int]) -> str:
    """The byte tokenizer's text of `tokens`, special tokens (BOS, EOS) left out."""
    return bytes(token for token in tokens if token < 256).decode("utf-8", errors="replace")


def test_the_single_turn_environment_rewards_the_sampled_text(
    embedded_server: EmbeddedWhitney, prefect_api: None, tmp_path: Path
) -> None:
    records, journal, _ = run_example(
        embedded_server, tmp_path, "rl", "shout.toml", "--cycles", "2"
    )
    assert [record["cycle"] for record in records] == [0, 1]
    for record in records:
        completions = [
            text(sequence["tokens"])
            for op in in_cycle(journal, record, "sample")
            for sequence in op.result["sequences"]
        ]
        capitals = [sum("A" <= c <= "Z" for c in t) / len(t) if t else 0.0 for t in completions]
        assert len(capitals) == 4 * 8
        assert record["reward_mean"] == pytest.approx(statistics.fmean(capitals), abs=1e-12)
        assert max(capitals) > 0


def test_the_multi_turn_environment_answers_each_word_in_the_transcript(
    embedded_server: EmbeddedWhitney, prefect_api: None, tmp_path: Path
) -> None:
    records, journal, payloads = run_example(
        embedded_server, tmp_path, "rl", "vowels.toml", "--cycles", "2"
    )
    turn = re.compile(r"(.*?) (Vowel!|No vowel\.) Say a word: ", re.DOTALL)
    for record in records:
        assert record["episodes"]["turns"] == {"3": 32}
        first, last = record["episodes"]["turn_records"][-1]["seq_ids"]
        rewards = []
        for op in journal:
            if op.kind != "sample" or not first <= op.seq_id <= last:
                continue
            prompt = text(payloads[op.seq_id]["prompt"]["token_ids"])
            assert prompt.startswith("Say a word: ")
            answered = turn.findall(prompt.removeprefix("Say a word: "))
            rebuilt = "".join(f"{word} {verdict} Say a word: " for word, verdict in answered)
            assert len(answered) == 2 and "Say a word: " + rebuilt == prompt, prompt
            for word, verdict in answered:
                assert (verdict == "Vowel!") == any(c in "aeiouAEIOU" for c in word), prompt
            earlier = sum(verdict == "Vowel!" for _, verdict in answered)
            for sequence in op.result["sequences"]:
                last_word = any(c in "aeiouAEIOU" for c in text(sequence["tokens"]))
                rewards.append((earlier + last_word) / 3)
        assert len(rewards) == 32
        assert record["reward_mean"] == pytest.approx(statistics.fmean(rewards), abs=1e-12)


def test_the_loss_recipe_trains_the_loss_computed_by_hand(
    embedded_server: EmbeddedWhitney, prefect_api: None, tmp_path: Path
) -> None:
    """importance_sampling with advantages reward minus the group's mean:
    L = sum over sequences and tokens of -exp(lp_t - q_t) * (r - mean r of its group)."""
    records, journal, _ = run_example(
        embedded_server, tmp_path, "rl", "centered.toml", "--cycles", "2"
    )
    digits = DigitsEnvironment()
    for record in records:
        by_hand = 0.0
        (trained,) = in_cycle(journal, record, "forward_backward")
        outputs = iter(trained.result["outputs"])
        for op in in_cycle(journal, record, "sample"):
            sequences = op.result["sequences"]
            rewards = [
                digits.reward("", Completion(text(s["tokens"]), s["stop_reason"] == "stop"))
                for s in sequences
            ]
            mean = statistics.fmean(rewards)
            for sequence, reward in zip(sequences, rewards, strict=True):
                learner = next(outputs)["logprobs"][-len(sequence["tokens"]) :]
                ratios = [
                    math.exp(p - q) for p, q in zip(learner, sequence["logprobs"], strict=True)
                ]
                by_hand -= sum(ratios) * (reward - mean)
        assert next(outputs, None) is None
        assert trained.result["loss"] == pytest.approx(by_hand, abs=1e-3)
        assert record["loss"] == trained.result["loss"]
    assert any(abs(record["loss"]) > 1e-2 for record in records)


def test_the_loss_recipe_is_refused_with_another_loss_or_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BYO))
    own = RLConfig(loss="importance_sampling", recipe="centered:RECIPE")
    assert compose_recipe(own).name == "centered"
    for recipe, loss, needle in [
        ("centered:RECIPE", "ppo", "trains importance_sampling, not ppo"),
        ("centered:NOPE", "importance_sampling", "has no attribute 'NOPE'"),
        ("centered", "importance_sampling", "or an import path module:attr"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(needle)) as refused:
            compose_recipe(RLConfig(loss=loss, recipe=recipe))
        assert refused.value.field == "recipe"


def test_the_sft_dataset_is_learned(
    embedded_server: EmbeddedWhitney, prefect_api: None, tmp_path: Path
) -> None:
    records, _, _ = run_example(embedded_server, tmp_path, "sft", "sft.toml", "--steps", "10")
    assert records[-1]["step_end"] == 10
    first, last = records[0]["evals"][0], records[-1]["evals"][-1]
    assert (first["step"], last["step"]) == (0, 10) and first["tokens"] == last["tokens"]
    assert last["loss"] < 0.8 * first["loss"]


def test_the_dpo_pairs_start_at_log_2_and_are_learned(
    embedded_server: EmbeddedWhitney, prefect_api: None, tmp_path: Path
) -> None:
    """The reference is the policy before training, so every margin of the first cycle is 0
    and its loss is -log sigmoid(0) = log 2."""
    records, _, _ = run_example(embedded_server, tmp_path, "dpo", "dpo.toml", "--cycles", "2")
    assert records[0]["loss"] == pytest.approx(math.log(2), abs=1e-9)
    assert records[0]["eval_before"]["accuracy"] == 0.0
    assert records[-1]["loss"] < records[0]["loss"] and records[-1]["reward_accuracy"] > 0.5


def test_the_cli_refuses_a_recipe_of_another_loss_in_one_line(
    embedded_server: EmbeddedWhitney,
    whitney_client: WhitneyClient,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.syspath_prepend(str(BYO))
    monkeypatch.setenv("WHITNEY_API_KEY", embedded_server.api_keys[0])
    config = tmp_path / "rl.toml"
    config.write_text('loss = "ppo"\nrecipe = "centered:RECIPE"\n')
    assert_refused_before_any_session(
        embedded_server.url,
        whitney_client,
        capsys,
        "rl",
        ["--config", str(config)],
        "recipe",
        "the centered recipe trains importance_sampling, not ppo",
    )


@pytest.mark.parametrize("name", ["shout", "vowels", "centered"])
def test_the_rl_examples_are_valid_configs(name: str) -> None:
    config = validated(RLConfig, read_config_file(BYO / f"{name}.toml"))
    assert config.base_model == "local/tiny"


def test_the_guide_names_every_example_and_each_is_run_here() -> None:
    guide = (ROOT / "docs" / "bring-your-own-task.md").read_text()
    named = set(re.findall(r"`(examples/byo/[\w.-]+)`", guide))
    shipped = {f"examples/byo/{path.name}" for path in BYO.iterdir() if path.is_file()}
    assert named == shipped
    source = Path(__file__).read_text()
    configs = {name for name in shipped if name.endswith(".toml")}
    assert all(f'"{Path(config).name}"' in source for config in configs)
