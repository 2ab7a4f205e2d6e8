"""`--set FIELD=VALUE` (flows.cli.settings): every field of every catalogue flow's config is
reachable (the model walked), values reach the config object, bad fields and values exit 2
with one line naming the field (and the nearest valid name); renamed fields' old names work
with one deprecation line; docs/config.md is what the models say."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from flowtest_cli import help_text
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from flows.catalogue import COMMANDS, TRAINING_FLOWS, TrainingFlow
from flows.cli.config_reference import reference_markdown
from flows.cli.main import main
from flows.cli.parsers import build_parser
from flows.cli.settings import Setting, apply_settings, settable_fields
from flows.core.config import ConfigError, validated
from flows.core.evaluation.config import EvalSettings
from flows.core.renames import RenamedSetting
from flows.distill.config import DistillationConfig
from flows.rl.config import RLConfig

ROOT = Path(__file__).resolve().parents[3]


def config_of(command: str, *arguments: str) -> BaseModel:
    """The validated config `whitney-flows run COMMAND ARGUMENTS` would run with."""
    import importlib

    from flows.catalogue import by_command

    options = build_parser().parse_args(["run", command, *arguments])
    module = importlib.import_module(by_command(command).cli_module)
    builder = next(getattr(module, name) for name in dir(module) if name.endswith("_config_from"))
    return builder(options)


def value_at(config: BaseModel, path: str) -> Any:
    value: Any = config
    for part in path.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def candidates(setting: Setting) -> list[Any]:
    """Values to try for a setting, other than its default first, then its default."""
    if setting.field.is_required():
        return ["x"]
    default = setting.field.get_default(call_default_factory=True)
    default = to_jsonable_python(default)
    others: list[Any] = []
    if isinstance(default, bool):
        others = [not default]
    elif isinstance(default, int | float):
        others = [default + 1, default / 2, default - 1]
    elif get_origin(setting.annotation) is Literal:
        others = [arg for arg in get_args(setting.annotation) if arg != default]
    else:
        for arg in get_args(setting.annotation):
            if get_origin(arg) is Literal:
                others = [value for value in get_args(arg) if value != default]
    return [*others, default]


@pytest.mark.parametrize("flow", TRAINING_FLOWS, ids=COMMANDS)
def test_every_field_of_every_flow_is_reachable_with_set(flow: TrainingFlow) -> None:
    """Each leaf of the model (nested ones dotted), set to a valid value, lands in the config."""
    settings = list(settable_fields(flow.config))
    top_level = {setting.path.split(".")[0] for setting in settings}
    assert top_level == set(flow.config.model_fields)
    changed = 0
    base = {name: "x" for name, field in flow.config.model_fields.items() if field.is_required()}
    checked = [s for s in settings if not s.path.startswith(("teacher_sft.", "prices."))]
    for setting in checked:  # those two tables are empty by default: set in the test below
        for value in candidates(setting):
            data = apply_settings(flow.config, dict(base), [f"{setting.path}={json.dumps(value)}"])
            try:
                config = validated(flow.config, data)
            except ConfigError:
                continue
            assert to_jsonable_python(value_at(config, setting.path)) == value, setting.path
            changed += value != candidates(setting)[-1]
            break
        else:
            raise AssertionError(f"{setting.path}: no value accepted")
    assert changed > len(checked) // 2, (changed, len(checked))


def test_set_values_reach_the_config_object() -> None:
    config = config_of(
        "rl",
        "--set",
        "learning_rate=0.01",
        "--set",
        "group_size=4",
        "--set",
        "rollout.max_turns=3",
        "--set",
        'tracking.backends=["tensorboard"]',
        "--set",
        "loss_config.beta=0.5",
        "--set",
        "env=arithmetic",
        "--set",
        "budget.max_tokens=1000",
        "--cycles",
        "5",
    )
    assert isinstance(config, RLConfig)
    assert (config.learning_rate, config.group_size, config.rollout.max_turns) == (0.01, 4, 3)
    assert config.tracking.backends == ["tensorboard"]
    assert (config.loss_config, config.env, config.cycles) == ({"beta": 0.5}, "arithmetic", 5)
    assert config.budget.max_tokens == 1000
    distill = config_of(
        "distill", "--set", "teacher_sft.steps=7", "--set", "prices.sampled_per_million=2"
    )
    assert isinstance(distill, DistillationConfig)
    assert distill.teacher_sft is not None and distill.teacher_sft.steps == 7
    assert distill.prices is not None and distill.prices.sampled_per_million == 2.0
    teacher = "whitney://runs/r1/states/final"  # as --teacher-checkpoint: no SFT teacher
    distill = config_of("distill", "--set", f"teacher_checkpoint={teacher}")
    assert isinstance(distill, DistillationConfig)
    assert (distill.teacher_checkpoint, distill.teacher_sft) == (teacher, None)
    sft = config_of("sft", "--lr", "0.1", "--set", "learning_rate=0.2", "--set", "steps=3")
    assert (sft.learning_rate, sft.steps) == (0.2, 3)  # type: ignore[attr-defined]


def test_set_goes_over_the_config_file_and_the_shorthands(tmp_path: Path) -> None:
    path = tmp_path / "rl.toml"
    path.write_text("cycles = 3\ngroup_size = 6\n[rollout]\nmax_turns = 2\n")
    config = config_of("rl", "--config", str(path), "--set", "rollout.max_episode_tokens=9")
    assert isinstance(config, RLConfig)
    assert (config.cycles, config.group_size, config.rollout.max_turns) == (3, 6, 2)
    config = config_of("rl", "--config", str(path), "--cycles", "4", "--set", "cycles=5")
    assert config.cycles == 5  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (
            ["--set", "learning_rat=0.1"],
            "--set learning_rat: RLConfig has no such field (did you mean learning_rate?)",
        ),
        (
            ["--set", "rollout.max_turn=3"],
            "--set rollout.max_turn: RLConfig has no such field (did you mean rollout.max_turns?)",
        ),
        (["--set", "zzz=1"], "--set zzz: RLConfig has no such field (every field: --help)"),
        (["--set", "group_size"], "--set: 'group_size': expected FIELD=VALUE"),
        (["--set", "group_size=1"], "group_size: Input should be greater than or equal to 2"),
        (["--set", "group_size=many"], "group_size: Input should be a valid integer"),
        (["--set", "cycles.x=1"], "--set cycles.x: cycles has no settings inside"),
        (["--set", "rollout=3"], "rollout: Input should be a valid dictionary"),
        (["--set", 'loss_config={"beta": "x"}'], "loss_config.beta: Input should be a valid"),
    ],
)
def test_a_bad_setting_exits_2_with_one_line_naming_it(
    arguments: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "rl", *arguments]) == 2
    captured = capsys.readouterr()
    error = captured.err
    assert error.startswith(f"whitney-flows run rl: {line}"), error
    assert error.count("\n") == 1 and "Traceback" not in error
    assert captured.out == ""


def test_rl_help_lists_every_field(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = help_text(capsys, monkeypatch, "rl")
    listed = {
        line.split(":")[0].strip()
        for line in text.split("settings of RLConfig")[1].splitlines()[1:]
    }
    assert listed == {setting.path for setting in settable_fields(RLConfig)}
    assert "  learning_rate: float (default: 0.002)" in text
    assert "  group_size: int (default: 8)" in text


def test_the_old_name_of_a_renamed_field_works_with_one_deprecation_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Distillation's `samples_per_prompt` is `group_size` (RL's name for the same thing):
    in a config file, in `--set`, in a stored config (a fork's parent, a Prefect parameter)."""
    with pytest.warns(
        RenamedSetting, match="^samples_per_prompt is deprecated: it is now group_size$"
    ):
        assert DistillationConfig.model_validate({"samples_per_prompt": 3}).group_size == 3
    with pytest.raises(
        ConfigError, match="samples_per_prompt is the old name of group_size: give only group_size"
    ):
        validated(DistillationConfig, {"samples_per_prompt": 3, "group_size": 3})
    path = tmp_path / "distill.toml"
    path.write_text("samples_per_prompt = 2\n[teacher_sft]\nsteps = 3\n")
    for arguments in (["--config", str(path)], ["--set", "samples_per_prompt=2"]):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            assert main(["run", "distill", *arguments, "--set", "cycles=0"]) == 2
        error = capsys.readouterr().err.splitlines()
        assert error == [
            "whitney-flows: samples_per_prompt is deprecated: it is now group_size",
            "whitney-flows run distill: cycles: Input should be greater than or equal to 1",
        ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = config_of("distill", "--config", str(path))
        assert isinstance(config, DistillationConfig) and config.group_size == 2
        config = config_of("distill", "--set", "samples_per_prompt=5")
        assert isinstance(config, DistillationConfig) and config.group_size == 5


def test_an_old_event_or_parameter_with_the_evaluations_old_name_still_loads() -> None:
    """The evaluation's k was `samples`: a `whitney.checkpoint.saved` event or an
    evaluate-checkpoint parameter stored before the rename still validates."""
    with pytest.warns(RenamedSetting, match="^samples is deprecated: it is now group_size$"):
        settings = EvalSettings.model_validate({"env": "digits", "samples": 3})
    assert settings == EvalSettings(env="digits", group_size=3)
    assert RLConfig(group_size=5).eval_settings().group_size == 5


def test_fork_set_uses_the_same_names_and_hints(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.catalogue import by_command
    from flows.cli.fork import check_fork_fields, fork_config

    rl = by_command("rl")
    with pytest.raises(ConfigError, match=r"did you mean learning_rate\?"):
        check_fork_fields(rl, ["learning_rat=0.1"], {})
    config = fork_config(rl, {"cycles": 4}, ["learning_rate=0.01", "rollout.max_turns=2"], "c")
    assert config == {
        "cycles": 4,
        "learning_rate": 0.01,
        "rollout": {"max_turns": 2},
        "resume_from": "c",
    }


def test_docs_config_is_the_models_reference(tmp_path: Path) -> None:
    """docs/config.md is generated: rewrite it with `whitney-flows docs config --out
    docs/config.md` when this fails."""
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == reference_markdown()
    out = tmp_path / "config.md"
    assert main(["docs", "config", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == reference_markdown()
    for flow in TRAINING_FLOWS:
        for setting in settable_fields(flow.config):
            assert setting.field.description, f"{flow.command}: {setting.path} undescribed"
            assert f"| `{setting.path}` |" in reference_markdown()


def test_docs_command_parses() -> None:
    options = build_parser().parse_args(["docs", "config"])
    assert options == argparse.Namespace(command="docs", topic="config", out=None)


def test_a_real_run_trains_with_the_set_values(tmp_path: Path) -> None:
    """`run rl --set ...` for two cycles: the Prefect flow run's parameters, the manifest's
    config and the metrics lines show the values set."""
    from flowtest_cli import run_console_script
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    metrics = tmp_path / "metrics.jsonl"
    settings = ["learning_rate=0.0037", "group_size=3", "prompts_per_cycle=2", "max_tokens=5"]
    arguments = [argument for setting in settings for argument in ("--set", setting)]
    run_console_script("rl", tmp_path, metrics, "--cycles", "2", *arguments)
    (manifest,) = (tmp_path / "adapters").glob("*-manifest.json")
    config = json.loads(manifest.read_text())["config"]
    expected = {"learning_rate": 0.0037, "group_size": 3, "prompts_per_cycle": 2, "max_tokens": 5}
    assert {name: config[name] for name in expected} == expected
    with get_client(sync_client=True) as prefect:
        runs = prefect.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["rl"])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=50,
        )
    ours = [
        run
        for run in runs
        if run.parameters.get("config", {}).get("learning_rate") == 0.0037
        and run.parameters["config"].get("group_size") == 3
    ]
    assert len(ours) == 1, [run.parameters.get("config") for run in runs]
    assert ours[0].state is not None and ours[0].state.is_completed()
    assert ours[0].parameters["config"]["max_tokens"] == 5
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:  # 2 groups of 3 samples, at most 5 tokens each
        assert 0 < line["tokens_sampled"] <= 2 * 3 * 5, line
