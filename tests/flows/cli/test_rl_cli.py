"""`whitney-flows`: the default RL run learns; bad arguments and configs exit 2 before any
session opens; `serve` starts without importing Prefect."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from flowtest_cli import Refusal, assert_downloaded, run_console_script

from flows.cli.main import main
from flows.core.config import ConfigError
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney.client import WhitneyClient


def test_a_default_run_learns_and_downloads_its_adapter(tmp_path: Path) -> None:
    """The defaults but half the cycles (the Quickstart, which CI runs too, makes all 30)."""
    metrics = tmp_path / "metrics.jsonl"
    cycles = RLConfig().cycles // 2
    output = run_console_script("rl", tmp_path, metrics, "--cycles", str(cycles))
    rewards = [json.loads(line)["reward_mean"] for line in metrics.read_text().splitlines()]
    assert len(rewards) == cycles
    first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
    assert last > first + 0.4, (first, last)
    assert_downloaded(tmp_path / "adapters", output)
    picture = metrics.with_suffix(".png")  # the summary's learning curves, beside the metrics
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Learning curves: {picture.resolve()}" in output


@pytest.mark.parametrize(
    ("arguments", "config", "field", "needle"),
    [
        (["--provider", "modal", "--loss", "dro"], None, "loss", "modal does not advertise"),
        (["--provider", "tinker", "--loss", "gspo"], None, "loss", "tinker does not advertise"),
        (["--loss", "no_such_loss"], None, "loss", "Input should be"),
        (["--cycles", "0"], None, "cycles", "greater than or equal to 1"),
        (["--env", "nowhere"], None, "env", "unknown environment"),
        (
            ["--provider", "modal"],
            "loss_config = {clip_low_threshold = 0.8}\n",
            "loss_config",
            "the importance_sampling recipe accepts: none",
        ),
        (
            ["--provider", "tinker"],
            "loss_config = {clip_high_threshold = 1.2}\n",
            "loss_config",
            "the importance_sampling recipe accepts: none",
        ),
        ([], "cycels = 3\n", "cycels", "Extra inputs are not permitted"),
        ([], "cycles = [\n", "--config", "is not valid toml"),
    ],
)
def test_bad_config_exits_2_naming_the_field_before_any_session(
    arguments: list[str],
    config: str | None,
    field: str,
    needle: str,
    tmp_path: Path,
    refused: Refusal,
) -> None:
    if config is not None:
        (tmp_path / "rl.toml").write_text(config)
        arguments = [*arguments, "--config", str(tmp_path / "rl.toml")]
    refused("rl", arguments, field, needle)


def test_flow_refuses_a_bad_config_before_any_session(
    small_config: RLConfig, inspector: WhitneyClient
) -> None:
    sessions_before = len(inspector.list_sessions())
    bad = small_config.model_copy(update={"provider": "modal", "loss_config": {"beta": 0.1}})
    with pytest.raises(ConfigError, match="loss_config"):
        rl_flow(bad)
    assert len(inspector.list_sessions()) == sessions_before


def test_unknown_arguments_exit_2() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "rl", "--cycels", "3"])
    assert exit_info.value.code == 2


def test_serve_dispatches_without_importing_prefect() -> None:
    probe = (
        "import sys\n"
        "from flows.cli.main import main\n"
        "try:\n"
        "    main(['serve', '--help'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0\n"
        "assert not [m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')]\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    assert "whitney-flows serve" in completed.stdout
    assert "--drop-after-commit-rate" in completed.stdout


def test_command_line_options_override_the_config_file(tmp_path: Path) -> None:
    from flows.cli.parsers import build_parser
    from flows.cli.run_rl import rl_config_from

    (tmp_path / "rl.json").write_text(json.dumps({"cycles": 7, "seed": 3, "group_size": 6}))
    options = build_parser().parse_args(
        ["run", "rl", "--config", str(tmp_path / "rl.json"), "--seed", "5", "--env", "lowercase"]
    )
    config = rl_config_from(options)
    assert (config.cycles, config.seed, config.group_size, config.env) == (7, 5, 6, "lowercase")
