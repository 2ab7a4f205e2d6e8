"""`whitney-flows run distill`: the demo's path (an SFT teacher first, then distillation) end
to end on a small scale, and bad configs exit 2 before any session opens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flowtest_cli import Refusal

from flows.cli.main import main
from whitney.local import EmbeddedWhitney


@pytest.mark.usefixtures("wide_terminal")
def test_the_demo_trains_an_sft_teacher_then_distills_from_it(
    whitney: EmbeddedWhitney, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    arguments = ["run", "distill", "--api-url", whitney.url, "--base-model", "local/nano"]
    arguments += ["--cycles", "2", "--sft-steps", "4", "--metrics-out", str(metrics)]
    arguments += ["--adapter-dir", str(tmp_path / "adapters")]
    assert main(arguments) == 0, capsys.readouterr().err
    output = capsys.readouterr().out
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["cycle"] for line in lines] == [0, 1]
    assert all(line["teacher_chunks"] == 8 for line in lines)
    teacher_lines = (tmp_path / "metrics-teacher-sft.jsonl").read_text().splitlines()
    assert json.loads(teacher_lines[-1])["step_end"] == 4
    adapter, manifest = sorted((tmp_path / "adapters").iterdir())
    assert adapter.name.endswith("-adapter.tar") and manifest.name.endswith("-manifest.json")
    for needle in ("teacher_kl, first", "eval loss, teacher", "tokens, teacher", str(adapter)):
        assert needle in output, needle
    assert "teacher SFT eval loss" in output  # the teacher was trained by the SFT subflow


@pytest.mark.parametrize(
    ("arguments", "field", "needle"),
    [
        (["--teacher-checkpoint", "s3://bucket/x"], "teacher_checkpoint", "should match pattern"),
        (["--budget-cost", "1.0"], "budget.max_cost", "needs a price table"),
        (["--cycles", "0"], "cycles", "greater than or equal to 1"),
        (["--base-model", "hf:not/cached"], "base_model", "not in the local Hugging Face cache"),
        (["--sft-steps", "0"], "teacher_sft.steps", "greater than or equal to 1"),
    ],
)
def test_bad_configs_exit_2_naming_the_field_before_any_session(
    arguments: list[str], field: str, needle: str, refused: Refusal
) -> None:
    refused("distill", arguments, field, needle)


def test_a_config_file_with_options_on_top(tmp_path: Path) -> None:
    from flows.cli.parsers import build_parser
    from flows.cli.run_distill import distill_config_from

    (tmp_path / "d.toml").write_text(
        "cycles = 7\nteacher_chunk_size = 3\n[budget]\nmax_tokens = 5000\n"
        "[prices]\nsampled_per_million = 2.0\n"
    )
    options = build_parser().parse_args(
        ["run", "distill", "--config", str(tmp_path / "d.toml"), "--cycles", "9"]
        + ["--task-runner", "dask", "--sequential-teacher", "--teacher", "base"]
    )
    config = distill_config_from(options)
    assert (config.cycles, config.teacher_chunk_size, config.task_runner) == (9, 3, "dask")
    assert config.teacher_fan_out is False and config.teacher_sft is None
    assert config.budget.max_tokens == 5000 and config.prices is not None
    options = build_parser().parse_args(["run", "distill", "--budget-tokens", "10"])
    config = distill_config_from(options)
    assert config.teacher_sft is not None and config.budget.max_tokens == 10
