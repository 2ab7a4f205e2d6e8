"""`whitney-flows run FLOW --help`: every option shows its default from the flow's config model,
and --loss, --env and --provider list their choices from the registries."""

from __future__ import annotations

import re
from typing import get_args

import pytest
from flowtest_cli import help_text
from pydantic import BaseModel

from flows.core.environments import ENVIRONMENTS, load_environment
from flows.core.environments.multiturn import MultiTurnEnvironment
from flows.core.evaluation.config import EvalSettings
from flows.distill.config import DistillationConfig
from flows.dpo.config import DPOConfig
from flows.rl.config import RLConfig
from flows.sft.config import SFTConfig
from whitney.losses import LOSS_FUNCTIONS
from whitney.wire import Provider


@pytest.mark.parametrize(
    ("flow", "model", "defaults"),
    [
        (
            "rl",
            RLConfig,
            {"--cycles": "cycles", "--env": "env", "--loss": "loss", "--seed": "seed"},
        ),
        ("sft", SFTConfig, {"--steps": "steps", "--lr": "learning_rate", "--schedule": "schedule"}),
        (
            "distill",
            DistillationConfig,
            {"--cycles": "cycles", "--chunk-size": "teacher_chunk_size"},
        ),
        (
            "dpo",
            DPOConfig,
            {
                "--cycles": "cycles",
                "--beta": "beta",
                "--lr": "learning_rate",
                "--reference": "reference",
            },
        ),
    ],
)
def test_help_shows_the_config_defaults(
    flow: str,
    model: type[BaseModel],
    defaults: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = help_text(capsys, monkeypatch, flow)
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  --")}
    for option, field in {
        **defaults,
        "--provider": "provider",
        "--base-model": "base_model",
        "--renderer": "renderer",
    }.items():
        default = model.model_fields[field].default
        assert lines[option].endswith(f"(default: {default})"), lines[option]


def test_help_lists_the_choices_of_loss_env_and_provider(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = help_text(capsys, monkeypatch, "rl")
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  --")}
    assert ", ".join(LOSS_FUNCTIONS) in lines["--loss"]
    assert ", ".join(ENVIRONMENTS) in lines["--env"] and "module:attr" in lines["--env"]
    assert ", ".join(sorted(get_args(Provider))) in lines["--provider"]


def test_the_env_fields_name_every_built_in_environment() -> None:
    """The config fields' descriptions (the config reference, `--help`) name the built-ins:
    RL every one, the evaluation and the distillation's prompts the single-turn ones."""
    single_turn = [
        name
        for name in ENVIRONMENTS
        if not isinstance(load_environment(name), MultiTurnEnvironment)
    ]
    assert "arithmetic" in single_turn and len(single_turn) < len(ENVIRONMENTS)
    descriptions = {
        "rl": (RLConfig.model_fields["env"].description, list(ENVIRONMENTS)),
        "eval": (EvalSettings.model_fields["env"].description, single_turn),
        "distill": (DistillationConfig.model_fields["prompts"].description, single_turn),
    }
    for where, (description, names) in descriptions.items():
        named = set(re.findall(r"\b[a-z]+\b", description or ""))
        assert set(names) <= named, (where, description)
