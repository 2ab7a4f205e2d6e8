"""`whitney-flows run rl --env quiz` with every other setting at its default but the cycles:
a smoke of the quiz learning, whose first 4 cycles the tiny model's reward on the multi-turn
quiz already climbs (0.047, 0.083, 0.161, 0.198 on this AMD EPYC). The 10 cycles that climb
well above where they started are `python benchmarks/learning_thresholds.py quiz`; the whole
default run (30 cycles) is measured in docs/measured.md (learn-quiz); two runs of one config
giving the same adapter sha256 are `tests/flows/rl/test_multiturn.py`'s."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from flowtest_cli import assert_downloaded, run_console_script

CYCLES = 4


def test_the_quiz_learns_in_its_first_cycles(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    output = run_console_script("rl", tmp_path, metrics, "--env", "quiz", "--cycles", str(CYCLES))
    assert_downloaded(tmp_path / "adapters", output)
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    rewards = [line["reward_mean"] for line in lines]
    print(f"quiz rewards {[round(reward, 3) for reward in rewards]}")
    assert len(rewards) == CYCLES
    first, last = statistics.fmean(rewards[:2]), statistics.fmean(rewards[-2:])
    assert first <= 0.3 and last >= first + 0.05, (first, last, rewards)
    assert {line["episodes"]["turns_per_episode"] for line in lines} == {3.0}
