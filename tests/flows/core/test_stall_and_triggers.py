"""Stall detection and the evaluate trigger, as Prefect reads them.

deployments/stall-automations.yaml validates as Prefect's automation model with no key it
would drop, one proactive automation per window of flows/core/loop/stall_windows.py; the window a
cycle
gets is the multiple of its recent cycle time rounded up to the next of them. (That the 15 s
automation cancels a flow run whose cycle never completed, and spares one whose cycle
completed or whose cleanup hook released it, is checked on a real Prefect server:
tests/e2e/test_checkpoints.py.) The evaluate-checkpoint trigger turns a checkpoint event into
parameters the flow accepts."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.events.schemas.automations import AutomationCore
from prefect.server.events.actions import RunDeployment
from prefect.server.events.schemas.events import ReceivedEvent
from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

from flows.checkpoints.evaluate import evaluate_checkpoint
from flows.core.loop.stall_windows import STALL_WINDOWS_S, StallSettings, stall_window
from flows.core.records.events import (
    ALL_WINDOWS,
    CYCLE_COMPLETED,
    CYCLE_STARTED,
    RUN_RELEASED,
    STALL_WINDOW_LABEL,
    flow_run_resource,
)
from flows.rl.config import RLConfig

ROOT = Path(__file__).resolve().parents[3]
STALL = ROOT / "deployments" / "stall-automations.yaml"
DEPLOYMENTS = ROOT / "deployments" / "prefect.yaml"


def automations() -> list[dict[str, Any]]:
    return yaml.safe_load(STALL.read_text())["automations"]


def test_one_proactive_automation_per_window() -> None:
    found = automations()
    assert [int(a["trigger"]["within"]) for a in found] == list(STALL_WINDOWS_S)
    assert len({a["name"] for a in found}) == len(found)
    for data in found:
        automation = AutomationCore.model_validate(data)
        assert set(data) <= set(AutomationCore.model_fields)
        assert set(data["trigger"]) <= set(type(automation.trigger).model_fields)
        trigger = automation.trigger
        window = str(int(trigger.within.total_seconds()))
        assert trigger.posture == "Proactive" and trigger.threshold == 1
        assert trigger.match.root == {
            "prefect.resource.id": "prefect.flow-run.*",
            STALL_WINDOW_LABEL: [window, ALL_WINDOWS],
        }
        assert trigger.for_each == {"prefect.resource.id"}
        assert trigger.after == {CYCLE_STARTED}  # its clock starts with a cycle
        assert trigger.expect == {CYCLE_STARTED, CYCLE_COMPLETED, RUN_RELEASED}
        (action,) = automation.actions
        assert action.type == "cancel-flow-run"


@pytest.mark.parametrize(
    ("seconds", "window"),
    [
        ([], 960),  # first_window_s 900, rounded up
        ([1.0], 15),
        ([2.0, 2.0, 4.0], 15),  # 5 x 2.67 = 13.3
        ([1.0] * 5 + [10.0] * 5, 60),  # the last 5 only: 5 x 10 = 50
        ([20_000.0], STALL_WINDOWS_S[-1]),  # beyond the last window: the last
    ],
)
def test_the_window_is_the_multiple_of_the_recent_cycle_time_rounded_up(
    seconds: list[float], window: int
) -> None:
    assert stall_window(StallSettings(), seconds) == window
    assert STALL_WINDOWS_S[0] == 15
    assert all(later == 2 * earlier for earlier, later in itertools.pairwise(STALL_WINDOWS_S))


def test_the_evaluate_trigger_gives_the_flow_its_parameters() -> None:
    (deployment,) = [
        d
        for d in yaml.safe_load(DEPLOYMENTS.read_text())["deployments"]
        if d["name"] == "evaluate-checkpoint"
    ]
    (trigger,) = deployment["triggers"]
    assert trigger["expect"] == ["whitney.checkpoint.saved"]
    settings = RLConfig(env="lowercase", group_size=4).eval_settings()
    checkpoint = "whitney://runs/run-abc/states/cycle-9"
    event = ReceivedEvent(
        id=uuid.uuid4(),
        occurred=datetime.now(UTC),
        event="whitney.checkpoint.saved",
        resource=flow_run_resource(uuid.uuid4(), **{"whitney.evaluable": "true"}),
        payload={"checkpoint": checkpoint, "evaluation": settings.model_dump()},
    )
    parameters = dict(trigger["parameters"])
    RunDeployment._upgrade_v1_templates(parameters)
    context = HydrationContext(
        raise_on_error=True, render_jinja=True, jinja_context={"event": event}
    )
    rendered = {**deployment["parameters"], **hydrate(parameters, context)}
    assert rendered["checkpoint"] == checkpoint
    validated = evaluate_checkpoint.validate_parameters(rendered)
    assert validated["config"].evaluation == settings
    assert validated["whitney_block"] == "whitney"
