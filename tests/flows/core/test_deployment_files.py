"""deployments/: prefect.yaml validates as Prefect's own model of it, every entrypoint loads
with the parameters its deployment sets, and the reaper runs every 15 minutes with apply on;
automations.yaml validates as Prefect's automation model (no key it would drop), the install
command of docs/prefect-server.md creates it on the harness's Prefect server, and it crashes a
Running flow run whose heartbeats stopped (with a 10 s window), not one that completed."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from flowtest_cli import run_ok
from prefect import flow, get_client
from prefect.cli.deploy._models import PrefectYamlModel
from prefect.events import emit_event
from prefect.events.schemas.automations import AutomationCore
from prefect.events.worker import EventsWorker
from prefect.flows import load_flow_from_entrypoint
from prefect.settings import PREFECT_API_URL
from prefect.settings.models.flows import FlowsSettings
from prefect.states import Completed, Running
from pydantic import BaseModel, RootModel

from flows.rl.config import RLConfig

ROOT = Path(__file__).resolve().parents[3]
DEPLOYMENTS = ROOT / "deployments" / "prefect.yaml"
AUTOMATIONS = ROOT / "deployments" / "automations.yaml"
GUIDE = ROOT / "docs" / "prefect-server.md"
HEARTBEATS_MISSED = 3
"""The automation waits for at least this many missed heartbeats at Prefect's default rate."""
TEST_WITHIN_S = 10
"""The automation's window in the firing test: the least Prefect takes for a proactive one."""
CRASH_DEADLINE_S = 90
"""How long the firing test waits for the Crashed state (window, 5 s evaluation, actions)."""
TRIGGER_RELOAD_S = 5
"""Prefect's triggers service reloads changed automations at least this often (its periodic
evaluation); on SQLite a new automation is loaded by a task the create request schedules,
which a busy server may run after events that arrived just behind it."""
HEARTBEAT_ROUNDS = 3
"""Heartbeats sent TRIGGER_RELOAD_S apart: one of them reaches the loaded automation."""


@flow(name="heartbeat-subject")
def subject() -> None:
    """Never run: its flow runs are created Running and beat by hand."""


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def unknown_keys(data: Any, model: BaseModel) -> list[str]:
    """The keys of `data` that `model` (validated from it) has no field for, at any depth
    (Prefect's automation models ignore them)."""
    unknown = []
    for key, value in data.items():
        if key not in type(model).model_fields:
            unknown.append(key)
            continue
        attribute = getattr(model, key)
        listed = isinstance(value, list) and isinstance(attribute, list)
        pairs = zip(value, attribute, strict=True) if listed else [(value, attribute)]
        for item, child in pairs:
            if (
                isinstance(item, dict)
                and isinstance(child, BaseModel)
                and not isinstance(child, RootModel)
            ):
                unknown += [f"{key}.{name}" for name in unknown_keys(item, child)]
    return unknown


def test_every_deployment_validates_and_its_entrypoint_takes_its_parameters() -> None:
    data = load(DEPLOYMENTS)
    PrefectYamlModel.model_validate(data)
    deployments = {deployment["name"]: deployment for deployment in data["deployments"]}
    assert list(deployments) == [
        "rl-on-demand",
        "rl-on-tinker",
        "sft-nightly",
        "distill-on-demand",
        "dpo-on-demand",
        "reap-every-15-minutes",
        "evaluate-checkpoint",
        "promote-checkpoint",
        "sweep-on-demand",
        "resume-sweep-every-5-minutes",
        "resume-run",
    ]
    for deployment in deployments.values():
        entrypoint = load_flow_from_entrypoint(str(ROOT / deployment["entrypoint"]))
        assert set(deployment["parameters"]) <= set(entrypoint.parameters.properties)
    tinker = deployments["rl-on-tinker"]
    assert tinker["entrypoint"] == deployments["rl-on-demand"]["entrypoint"]
    assert tinker["parameters"] == {
        "whitney_block": "whitney-tinker",
        "config": {"provider": "tinker"},
    }
    RLConfig.model_validate(tinker["parameters"]["config"])  # the rest defaults
    reaper = deployments["reap-every-15-minutes"]
    assert reaper["entrypoint"] == "flows/reap/flow.py:reap_orphaned_sessions"
    assert reaper["parameters"] == {"whitney_block": "whitney", "apply": True}
    assert reaper["schedules"] == [{"interval": 900, "active": True}]
    backstop = deployments["resume-sweep-every-5-minutes"]
    assert backstop["entrypoint"] == "flows/resume/sweep.py:resume_sweep"
    assert backstop["parameters"] == deployments["resume-run"]["parameters"]
    assert backstop["schedules"] == [{"interval": 300, "active": True}]


def test_the_automation_is_a_proactive_heartbeat_trigger_that_crashes_the_flow_run() -> None:
    (data,) = load(AUTOMATIONS)["automations"]
    automation = AutomationCore.model_validate(data)
    assert unknown_keys(data, automation) == []
    trigger = automation.trigger
    assert trigger.posture == "Proactive"
    assert trigger.after == {"prefect.flow-run.heartbeat"}
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed"} <= trigger.expect
    assert trigger.for_each == {"prefect.resource.id"}
    default_frequency = FlowsSettings.model_fields["heartbeat_frequency"].default
    assert trigger.within.total_seconds() >= HEARTBEATS_MISSED * default_frequency
    (action,) = automation.actions
    assert (action.type, action.state.value) == ("change-flow-run-state", "CRASHED")


def test_the_guides_command_installs_the_automation() -> None:
    (command,) = [
        line
        for line in GUIDE.read_text().splitlines()
        if line.startswith("prefect automation") and line.endswith("/automations.yaml")
    ]
    argv = shlex.split(command)
    (name,) = [automation["name"] for automation in load(AUTOMATIONS)["automations"]]
    environment = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    executable = Path(sys.executable).with_name(argv[0])
    run_ok([str(executable), *argv[1:]], ROOT, environment, timeout=120)
    with get_client(sync_client=True) as prefect:
        installed = prefect.read_automations_by_name(name)
        try:
            assert len(installed) == 1
            assert installed[0].trigger.within.total_seconds() == 600
        finally:
            for automation in installed:
                prefect.delete_automation(automation.id)


def test_the_automation_crashes_a_running_flow_run_whose_heartbeats_stopped() -> None:
    (data,) = load(AUTOMATIONS)["automations"]
    with get_client(sync_client=True) as prefect:
        silent, completed = (prefect.create_flow_run(subject, state=Running()) for _ in "ab")
        resources = [f"prefect.flow-run.{run.id}" for run in (silent, completed)]
        trigger = {**data["trigger"], "within": TEST_WITHIN_S}
        trigger["match"] = {"prefect.resource.id": resources}  # these two flow runs only
        automation_id = prefect.create_automation(
            AutomationCore.model_validate({**data, "trigger": trigger})
        )
        try:
            for round_ in range(HEARTBEAT_ROUNDS):
                if round_:
                    time.sleep(TRIGGER_RELOAD_S)
                for resource in resources:
                    emit_event(
                        "prefect.flow-run.heartbeat", resource={"prefect.resource.id": resource}
                    )
                EventsWorker.drain_all()
            prefect.set_flow_run_state(completed.id, Completed())
            deadline = time.monotonic() + CRASH_DEADLINE_S
            while prefect.read_flow_run(silent.id).state.type.value != "CRASHED":
                assert time.monotonic() < deadline, prefect.read_flow_run(silent.id).state
                time.sleep(1)
            state = prefect.read_flow_run(silent.id).state
            assert "No heartbeat" in (state.message or "")
            assert prefect.read_flow_run(completed.id).state.type.value == "COMPLETED"
        finally:
            prefect.delete_automation(automation_id)
