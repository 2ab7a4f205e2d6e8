"""`whitney-flows run rl --env quiz` with every other setting at its default: the tiny model
learns the multi-turn quiz, and a second run trains the same adapter, bit for bit."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

from flowtest_cli import assert_downloaded, run_console_script

from flows.rl.config import RLConfig


def test_the_quiz_learns_with_the_defaults_and_trains_the_same_adapter_twice(
    tmp_path: Path,
) -> None:
    runs = []
    for name in ("first", "second"):
        directory = tmp_path / name
        directory.mkdir()
        metrics = directory / "metrics.jsonl"
        output = run_console_script("rl", directory, metrics, "--env", "quiz")
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        assert_downloaded(directory / "adapters", output)
        (adapter,) = (directory / "adapters").iterdir()
        runs.append((lines, hashlib.sha256(adapter.read_bytes()).hexdigest()))
    (lines, first_sha256), (again, second_sha256) = runs
    rewards = [line["reward_mean"] for line in lines]
    assert len(rewards) == RLConfig().cycles <= 40
    first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
    assert first <= 0.3 and last >= 0.7, (first, last, rewards)
    assert {line["episodes"]["turns_per_episode"] for line in lines} == {3.0}
    assert first_sha256 == second_sha256
    assert [line["reward_mean"] for line in again] == rewards
