"""`whitney-flows run sft`: the default run at least halves the eval loss and downloads its
adapter; bad arguments, configs and data exit 2 naming the field (and the line) before any
session opens."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from flows.cli import build_parser, main
from flows.run_sft import sft_config_from
from flows.sft_config import DEFAULT_STEPS
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

CONSOLE_SCRIPT = Path(sys.executable).with_name("whitney-flows")


def test_default_run_halves_the_eval_loss(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("WHITNEY_API_")
    }
    environment |= {
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "COLUMNS": "200",
    }
    completed = subprocess.run(
        [str(CONSOLE_SCRIPT), "run", "sft", "--metrics-out", str(metrics)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert lines[-1]["step_end"] == DEFAULT_STEPS
    evals = [point for line in lines for point in line["evals"]]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == DEFAULT_STEPS
    first, last = evals[0]["loss"], evals[-1]["loss"]
    assert last <= 0.5 * first, (first, last)
    (adapter,) = (tmp_path / "adapters").iterdir()
    assert adapter.name.endswith("-adapter.tar")
    assert hashlib.sha256(adapter.read_bytes()).hexdigest() in completed.stdout
    assert str(adapter) in completed.stdout
    assert f"{first:.4f}" in completed.stdout and f"{last:.4f}" in completed.stdout


def jsonl(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD = '{"prompt": "Q: hi\\nA: ", "completion": "hello"}'


@pytest.mark.parametrize(
    ("arguments", "config", "data", "field", "needle"),
    [
        (["--data", "{tmp}/nowhere.jsonl"], None, None, "data_path", "cannot read"),
        ([], None, [GOOD, GOOD, '{"prompt": "x",'], "data_path", "line 3: not valid JSON"),
        ([], None, [GOOD, '{"prompt": "x"}', GOOD], "data_path", "line 2: missing field"),
        ([], None, [GOOD], "eval_fraction", "leaves none to train on"),
        (["--steps", "0"], None, None, "steps", "greater than or equal to 1"),
        (["--epochs", "0"], None, None, "epochs", "greater than or equal to 1"),
        (["--schedule", "exponential"], None, None, "schedule", "Input should be"),
        (["--lr", "0"], None, None, "learning_rate", "greater than 0"),
        (["--base-model", "gpt"], None, None, "base_model", "unknown base model"),
        ([], "cycles = 3\n", None, "cycles", "not by cycles"),
        ([], "batch_sise = 3\n", None, "batch_sise", "Extra inputs are not permitted"),
        ([], "steps = [\n", None, "--config", "is not valid toml"),
    ],
)
def test_bad_config_exits_2_naming_the_field_before_any_session(
    arguments: list[str],
    config: str | None,
    data: list[str] | None,
    field: str,
    needle: str,
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions_before = len(inspector.list_sessions())
    arguments = [argument.replace("{tmp}", str(tmp_path)) for argument in arguments]
    if config is not None:
        (tmp_path / "sft.toml").write_text(config)
        arguments += ["--config", str(tmp_path / "sft.toml")]
    if data is not None:
        arguments += ["--data", str(jsonl(tmp_path / "data.jsonl", *data))]
    code = main(["run", "sft", "--api-url", whitney.url, *arguments])
    error = capsys.readouterr().err
    assert code == 2
    assert error.startswith(f"whitney-flows run sft: {field}: "), error
    assert needle in error
    assert "Traceback" not in error
    assert len(inspector.list_sessions()) == sessions_before


def test_steps_and_epochs_exclude_each_other() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "sft", "--steps", "3", "--epochs", "2"])
    assert exit_info.value.code == 2


def test_command_line_options_override_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "sft.json").write_text(json.dumps({"epochs": 4, "seed": 3, "batch_size": 6}))
    base = ["run", "sft", "--config", str(tmp_path / "sft.json")]
    options = build_parser().parse_args([*base, "--seed", "5", "--lr", "0.01"])
    config = sft_config_from(options)
    assert (config.epochs, config.seed, config.batch_size, config.learning_rate) == (4, 5, 6, 0.01)
    options = build_parser().parse_args([*base, "--steps", "7", "--schedule", "linear"])
    config = sft_config_from(options)
    assert (config.steps, config.epochs, config.schedule) == (7, None, "linear")
    options = build_parser().parse_args([*base, "--data", "x.jsonl", "--base-model", "local/nano"])
    config = sft_config_from(options)
    assert (config.data_path, config.base_model) == ("x.jsonl", "local/nano")
