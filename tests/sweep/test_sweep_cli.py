"""`whitney-flows sweep` refuses a bad sweep in one line naming the field, exit code 2,
before it needs a Prefect server; and without one, it says so the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = 'kind = "rl"\nrungs = [2, 4]\n[grid]\nlearning_rate = [0.001, 0.002]\n'


def sweep(
    tmp_path: Path, text: str, suffix: str = ".toml", *arguments: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"sweep{suffix}"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_URL")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "flows.cli.main", "sweep", str(path), *arguments],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("setting", "line"),
    [
        (
            "max_concurent=3",
            "--set max_concurent: SweepConfig has no such field (did you mean max_concurrent?)",
        ),
        ("grid.learning_rate=[2.0]", "learning_rate: Input should be less than or equal"),
        ("max_concurrent=0", "max_concurrent: Input should be greater than or equal to 1"),
        ("base.learning_rate=0.01", "PREFECT_API_URL: a sweep runs its trials"),
    ],
)
def test_set_goes_over_the_sweep_file(tmp_path: Path, setting: str, line: str) -> None:
    """`--set` reaches every SweepConfig field, checked like the file's own."""
    ran = sweep(tmp_path, GOOD, ".toml", "--set", setting)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith(f"whitney-flows sweep: {line}"), ran.stderr
    assert ran.stderr.count("\n") == 1 and "Traceback" not in ran.stderr


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            'rungs = [2, 4]\n[grid]\n"lora.rank" = [4, 8]\n',
            "grid.lora.rank: RLConfig has no field 'lora.rank'",
        ),
        ('kind = "sft"\n[grid]\nwarmup_step = [1]\n', "grid.warmup_step: SFTConfig has no field"),
        ("max_concurent = 3\n", "max_concurent: Extra inputs are not permitted"),
        ("[grid]\nlearning_rate = [2.0]\n", "learning_rate: Input should be less than or equal"),
        (GOOD, "PREFECT_API_URL: a sweep runs its trials on a work pool"),
    ],
)
def test_a_bad_sweep_is_one_line_and_exit_2(tmp_path: Path, text: str, line: str) -> None:
    ran = sweep(tmp_path, text)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith(f"whitney-flows sweep: {line}")
    assert ran.stderr.count("\n") == 1 and "Traceback" not in ran.stderr
    assert ran.stdout == ""
