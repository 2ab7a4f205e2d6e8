"""Which endings the automatic resume continues (flows.resume.continuation), the lineage tags read
back, the attempt bound, the resume-run trigger as Prefect validates it, and the outage
notice (flows.core.orchestration.orchestrator) on Prefect's own log lines."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from prefect.events.schemas.automations import EventTrigger

from flows.core.orchestration.orchestrator import PrefectAwayNotice, prefect_away_notice
from flows.resume.continuation import (
    Continuation,
    lineage_from_tags,
    next_attempt,
    resume_reason,
    without_lineage,
)

ROOT = Path(__file__).resolve().parents[3]
TRAINING_DEPLOYMENTS = ["rl-on-demand", "sft-nightly", "distill-on-demand", "dpo-on-demand"]


@pytest.mark.parametrize(
    ("state", "message", "reason"),
    [
        ("CRASHED", "Flow run infrastructure exited with non-zero status code -9.", "crashed"),
        (
            "FAILED",
            "Flow run encountered an exception: ConnectError: All connection attempts failed",
            "infrastructure:ConnectError",
        ),
        (
            "FAILED",
            "Flow run encountered an exception: PrefectAway: cycle 2: the Prefect API stayed away",
            "infrastructure:PrefectAway",
        ),
        (
            "FAILED",
            "Flow run encountered an exception: Unavailable: 503 the server is rebuilding",
            "infrastructure:Unavailable",
        ),
        (  # the Prefect server overloaded or restarting, after the client's retries
            "FAILED",
            "Flow run encountered an exception: PrefectHTTPStatusError: Server error '503 "
            "Service Unavailable' for url 'http://127.0.0.1:4200/api/task_runs/'",
            "infrastructure:PrefectHTTPStatusError",
        ),
        (
            "FAILED",
            "Flow run encountered an exception: PrefectHTTPStatusError: Client error '422 "
            "Unprocessable Entity' for url 'http://127.0.0.1:4200/api/flow_runs/'",
            None,
        ),
        ("FAILED", "Flow run encountered an exception: ConfigError: cycles: too big", None),
        ("FAILED", "Flow run encountered an exception: InjectedFault: e2e fault", None),
        ("FAILED", "Flow run encountered an exception: InvalidRequest: bad loss", None),
        ("FAILED", None, None),
        ("CANCELLED", "Cancelled by the UI", None),
        ("COMPLETED", "All states completed.", None),
    ],
)
def test_only_crashes_and_infrastructure_failures_are_resumed(
    state: str, message: str | None, reason: str | None
) -> None:
    assert resume_reason(state, message) == reason


def test_the_lineage_round_trips_through_tags() -> None:
    lineage = Continuation("4b0c-parent", after_cycle=3, reason="crashed", attempt=2)
    tags = ["whitney", "rl", *lineage.tags()]
    assert lineage_from_tags(tags) == lineage
    assert without_lineage(tags) == ["whitney", "rl"]
    assert lineage_from_tags(["whitney", "rl"]) is None
    assert lineage.as_dict() == {
        "parent_flow_run": "4b0c-parent",
        "after_cycle": 3,
        "reason": "crashed",
        "attempt": 2,
    }


def test_attempts_count_only_runs_in_a_row_after_the_same_cycle() -> None:
    assert next_attempt(None, 4) == 1
    parent = Continuation("p", after_cycle=4, reason="crashed", attempt=2)
    assert next_attempt(parent, 4) == 3  # crashed again before its next checkpoint
    assert next_attempt(parent, 6) == 1  # it made progress: the count starts again
    assert next_attempt(Continuation("p", -1, "crashed"), -1) == 2  # no checkpoint, twice


def test_the_resume_trigger_matches_only_failed_or_crashed_training_deployments() -> None:
    data = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    (deployment,) = [d for d in data["deployments"] if d["name"] == "resume-run"]
    assert deployment["entrypoint"] == "flows/resume/flow.py:resume_run"
    (trigger,) = deployment["triggers"]
    parsed = EventTrigger.model_validate({k: v for k, v in trigger.items() if k != "parameters"})
    assert sorted(parsed.expect) == ["prefect.flow-run.Crashed", "prefect.flow-run.Failed"]
    assert trigger["match_related"]["prefect.resource.role"] == "deployment"
    assert trigger["match_related"]["prefect.resource.name"] == TRAINING_DEPLOYMENTS
    assert trigger["parameters"] == {"flow_run_id": "{{ event.resource.id }}"}
    names = {d["name"] for d in data["deployments"]}
    assert set(TRAINING_DEPLOYMENTS) <= names


def test_prefects_outage_errors_become_one_line_when_away_and_one_when_back() -> None:
    said: list[str] = []
    concurrency = logging.getLogger("prefect._internal.concurrency")
    events = logging.getLogger("prefect.events.clients")
    with prefect_away_notice(said.append) as notice:
        assert isinstance(notice, PrefectAwayNotice)
        for _ in range(9):
            concurrency.error("Service %r failed to process item %r", "EventsWorker", "event")
        events.warning("Unable to connect to 'ws://x/events/in'. Otherwise event data may be lost")
        concurrency.warning("Still processing items: 3 items remaining...")  # not an outage
        notice.back()
        notice.back()
    assert len(said) == 2
    assert said[0].startswith("Prefect is away (")
    assert "Service 'EventsWorker' failed to process item 'event'" in said[0]
    assert said[1].startswith("Prefect is back after ") and "(10 of its errors hidden)" in said[1]
    assert notice not in concurrency.filters and notice not in events.filters
