"""`whitney-flows run dpo`: the example config runs as a user runs it and downloads its
adapter; bad arguments, pairs and references exit 2 with one line naming the field (and the
line) before any session opens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from flowtest_cli import Refusal, assert_downloaded, run_console_script

from flows.cli.parsers import build_parser
from flows.cli.run_dpo import dpo_config_from
from flows.dpo.plan import check_dpo_config
from whitney.client import WhitneyClient

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
GOOD = '{"prompt": "1+1=", "chosen": "2", "rejected": "Maybe 3, I think."}'
GOOD2 = '{"prompt": "2+2=", "chosen": "4", "rejected": "Around 5."}'


def test_the_example_runs_and_downloads_its_adapter(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    arguments = [
        "--config",
        str(EXAMPLES / "dpo.toml"),
        "--data",
        str(EXAMPLES / "dpo-pairs.jsonl"),
    ]
    output = run_console_script("dpo", tmp_path, metrics, *arguments, "--cycles", "2")
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["cycle"] for line in lines] == [0, 1]
    after = lines[-1]["eval"]["accuracy"]
    assert re.search(r"held-out accuracy, before +│ 0\.000 ", output), output
    assert re.search(rf"held-out accuracy, after +│ {after:.3f} ", output), output
    assert_downloaded(tmp_path / "adapters", output)


def pairs_file(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("arguments", "data", "field", "needle"),
    [
        ([], None, "data_path", "Field required"),
        (
            [],
            [GOOD, '{"prompt": "1+2=", "chosen": "3", "rejected": ""}'],
            "data_path",
            "line 2: field 'rejected' is empty",
        ),
        (
            [],
            [GOOD, '{"prompt": "1+2=", "chosen": " ", "rejected": "4"}'],
            "data_path",
            "line 2: field 'chosen' is empty",
        ),
        ([], [GOOD, GOOD2, '{"prompt": "x",'], "data_path", "line 3: not valid JSON"),
        (
            [],
            [GOOD, '{"chosen": "3", "rejected": "4"}'],
            "data_path",
            "line 2: needs a string 'prompt' or a 'messages' list",
        ),
        ([], [GOOD], "eval_fraction", "leaves none to train on"),
        (["--reference", "sft"], [GOOD, GOOD2], "reference", "String should match pattern"),
        (
            ["--reference", "whitney://runs/run-nowhere/states/sft"],
            [GOOD, GOOD2],
            "reference",
            "does not exist: no run run-nowhere here",
        ),
        (["--beta", "0"], [GOOD, GOOD2], "beta", "greater than 0"),
    ],
)
def test_bad_input_exits_2_naming_the_field_before_any_session(
    arguments: list[str],
    data: list[str] | None,
    field: str,
    needle: str,
    tmp_path: Path,
    inspector: WhitneyClient,
    refused: Refusal,
) -> None:
    inspector.capabilities()  # the server answers its first capabilities slowly on a busy CPU
    if data is not None:
        arguments = [*arguments, "--data", str(pairs_file(tmp_path / "pairs.jsonl", *data))]
    refused("dpo", arguments, field, needle)


def test_a_reference_state_the_run_never_saved_is_refused(
    tmp_path: Path, inspector: WhitneyClient, refused: Refusal
) -> None:
    session = inspector.open_session({"test": "dpo-reference"})
    run_id = inspector.create_run(session.session_id, "local", "local/tiny").run_id
    inspector.close_session(session.session_id)
    data = str(pairs_file(tmp_path / "pairs.jsonl", GOOD, GOOD2))
    reference = f"whitney://runs/{run_id}/states/cycle-3"
    arguments = ["--data", data, "--reference", reference]
    refused("dpo", arguments, "reference", f"run {run_id} saved no such state")


def test_command_line_options_override_the_config_file(tmp_path: Path) -> None:
    options = build_parser().parse_args(
        ["run", "dpo", "--config", str(EXAMPLES / "dpo.toml"), "--beta", "0.3", "--cycles", "3"]
    )
    config = dpo_config_from(options)
    assert (config.beta, config.cycles, config.base_model) == (0.3, 3, "local/tiny")
    assert config.data_path == "examples/dpo-pairs.jsonl"  # relative to the repository root
    plan = check_dpo_config(
        config.model_copy(update={"data_path": str(EXAMPLES / "dpo-pairs.jsonl")})
    )
    assert (len(plan.train), len(plan.eval)) == (38, 10)
