"""Every command's list of training flows is the catalogue's (flows.catalogue): `run`'s
subcommands, the flows `fork` takes, the sweep's kinds, the automatic resume's deployments
and its trigger's; and each entry is what deployments/prefect.yaml and the flow itself say."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
from pathlib import Path

import pytest
import yaml

from flows.catalogue import COMMANDS, DEPLOYMENTS, TRAINING_FLOWS, TrainingFlow, by_command
from flows.cli.fork import PROG, check_fork_fields
from flows.cli.main import main
from flows.cli.parsers import build_parser
from flows.core.config import ConfigError
from flows.core.records.manifest import MANIFEST_VERSION
from flows.resume.sweep import resume_sweep
from flows.sweep.config import SweepConfig
from flows.sweep.kinds import TRIAL_KINDS, trial_kind
from flows.sweep.plan import check_sweep_config, trial_settings

ROOT = Path(__file__).resolve().parents[2]


def deployments() -> dict[str, dict]:
    data = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    return {deployment["name"]: deployment for deployment in data["deployments"]}


def test_run_has_one_subcommand_per_flow_and_each_runs_its_module() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (flows,) = [
        a for a in commands.choices["run"]._actions if isinstance(a, argparse._SubParsersAction)
    ]
    assert tuple(flows.choices) == COMMANDS
    for flow in TRAINING_FLOWS:
        module = importlib.import_module(flow.cli_module)
        assert callable(module.checked_config) and callable(module.progress_bars)
        assert flows._choices_actions[COMMANDS.index(flow.command)].help == flow.summary
        line = getattr(module, flow.progress)  # the progress line and the summary it names
        assert callable(line) and callable(getattr(module, flow.summary_table))
        assert flow.check is None or callable(flow.load_check())
        assert flow.load_flow().name == flow.name  # the entrypoint's flow
    with pytest.raises(ConfigError, match="FLOW: unknown training flow 'reap': one of rl, sft"):
        by_command("reap")


@pytest.mark.parametrize("flow", TRAINING_FLOWS, ids=COMMANDS)
def test_fork_takes_every_flow_and_checks_against_its_config(
    flow: TrainingFlow, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest of each flow gets as far as checking `--set` against that flow's config
    (before any server is asked about its checkpoints), which has the fields no other
    flow's config has."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {"manifest_version": MANIFEST_VERSION, "flow": flow.name, "run_id": "r", "config": {}}
        )
    )
    code = main(["fork", str(manifest), "--cycle", "0", "--set", "no_such=1"])
    error = capsys.readouterr().err
    assert (code, error) == (
        2,
        f"{PROG}: --set no_such: {flow.config.__name__} has no such field (every field: --help)\n",
    )
    others = [other.config.model_fields for other in TRAINING_FLOWS if other is not flow]
    own = set(flow.config.model_fields).difference(*others)
    assert own
    check_fork_fields(flow, [f"{field}=1" for field in own], {})
    for other in TRAINING_FLOWS:
        if other is not flow:
            with pytest.raises(ConfigError, match="has no such field"):
                check_fork_fields(other, [f"{field}=1" for field in own], {})


def test_fork_refuses_a_manifest_of_no_training_flow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {"manifest_version": MANIFEST_VERSION, "flow": "sweep", "run_id": "r", "config": {}}
        )
    )
    assert main(["fork", str(manifest), "--cycle", "0"]) == 2
    assert "its manifest names no training flow" in capsys.readouterr().err


def test_the_sweep_has_one_kind_per_flow() -> None:
    assert tuple(TRIAL_KINDS) == COMMANDS
    for flow in TRAINING_FLOWS:
        kind = trial_kind(flow.command)
        assert (kind.config, kind.deployment) == (flow.config, f"{flow.name}/{flow.deployment}")
    with pytest.raises(ConfigError, match="^kind: unknown training flow 'reap'"):
        trial_kind("reap")
    distill = SweepConfig(kind="distill", grid={"kl_coef": [0.5, 1.0]}, rungs=[1, 2])
    assert [trial_settings(distill, trial, 2, None) for trial in check_sweep_config(distill)] == [
        {"kl_coef": 0.5, "cycles": 2},
        {"kl_coef": 1.0, "cycles": 2},
    ]


def test_the_resume_sweeps_and_is_triggered_by_every_flows_deployment() -> None:
    default = inspect.signature(resume_sweep.fn).parameters["deployments"].default
    assert default == DEPLOYMENTS
    (trigger,) = deployments()["resume-run"]["triggers"]
    assert trigger["match_related"]["prefect.resource.name"] == list(DEPLOYMENTS)


def test_each_entry_is_its_deployment_and_its_flow() -> None:
    declared = deployments()
    for flow in TRAINING_FLOWS:
        assert declared[flow.deployment]["entrypoint"] == flow.entrypoint
        path, _, function = flow.entrypoint.partition(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        prefect_flow = getattr(module, function)
        assert prefect_flow.name == flow.name
        assert inspect.signature(prefect_flow.fn).parameters["config"].annotation in (
            flow.config,
            flow.config.__name__,
        )
