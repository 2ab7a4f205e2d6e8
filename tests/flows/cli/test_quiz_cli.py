"""`whitney-flows run rl --env quiz` with every other setting at its default: the tiny model
learns the multi-turn quiz within the default 30 cycles. (One run, to keep CI short: two runs
of one config giving the same adapter sha256 are `tests/flows/rl/test_multiturn.py`'s.)"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from flowtest_cli import assert_downloaded, run_console_script

from flows.rl.config import RLConfig


def test_the_quiz_learns_with_the_defaults(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    output = run_console_script("rl", tmp_path, metrics, "--env", "quiz")
    assert_downloaded(tmp_path / "adapters", output)
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    rewards = [line["reward_mean"] for line in lines]
    print(f"quiz rewards {[round(reward, 3) for reward in rewards]}")
    assert len(rewards) == RLConfig().cycles <= 40
    first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
    assert first <= 0.3 and last >= 0.7, (first, last, rewards)
    assert {line["episodes"]["turns_per_episode"] for line in lines} == {3.0}
