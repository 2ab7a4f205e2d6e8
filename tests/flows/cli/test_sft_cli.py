"""`whitney-flows run sft`: a short run (the defaults but 10 steps) lowers the eval loss and
downloads its adapter (the default run, 60 steps, at least halves it: `python
benchmarks/learning_thresholds.py sft`); bad arguments, configs and data exit 2 naming the field
(and the line) before any session opens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flowtest_cli import Refusal, assert_downloaded, run_console_script

from flows.cli.main import main
from flows.cli.parsers import build_parser
from flows.cli.run_sft import sft_config_from

SHORT_STEPS = 10


def test_a_short_run_lowers_the_eval_loss(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    output = run_console_script("sft", tmp_path, metrics, "--steps", str(SHORT_STEPS))
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert lines[-1]["step_end"] == SHORT_STEPS
    evals = [point for line in lines for point in line["evals"]]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == SHORT_STEPS
    first, last = evals[0]["loss"], evals[-1]["loss"]
    print(f"sft eval loss {first:.4f} -> {last:.4f} in {SHORT_STEPS} steps")
    assert last <= 0.7 * first, (first, last)  # 6.0895 -> 3.4616 on this AMD EPYC
    assert_downloaded(tmp_path / "adapters", output)
    assert f"{first:.4f}" in output and f"{last:.4f}" in output


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
        (["--base-model", "gpt"], None, None, "base_model", "not a Hugging Face repo id"),
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
    tmp_path: Path,
    refused: Refusal,
) -> None:
    arguments = [argument.replace("{tmp}", str(tmp_path)) for argument in arguments]
    if config is not None:
        (tmp_path / "sft.toml").write_text(config)
        arguments += ["--config", str(tmp_path / "sft.toml")]
    if data is not None:
        arguments += ["--data", str(jsonl(tmp_path / "data.jsonl", *data))]
    refused("sft", arguments, field, needle)


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
