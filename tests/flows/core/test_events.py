"""The events of the flows, against the table of docs/evaluation.md (*Events*): every event a
flow run emits is in it with exactly the payload keys and resource labels it lists, and every
name in it is emitted here (a trained RL run, the session's `checkpointed_run`; the checkpoint
flows' and the cleanup hook's functions). Each event's resource is the top-level flow run;
cycle events come in order, each started one with the window the completed one repeats."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from flowtest_helpers import CheckpointedRun
from prefect import flow

from flows.core.records import events
from flows.core.records.lineage import Change, Lineage
from whitney.uris import checkpoint_run_id

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "evaluation.md"


def guide_table() -> dict[str, tuple[set[str], set[str]]]:
    """event name -> (resource labels, payload keys), from the guide's events table."""
    text = GUIDE.read_text().split("## Events", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| `whitney.")]
    table = {}
    for row in rows:
        name, _, labels, payload = (cell.strip() for cell in row.strip().strip("|").split("|"))
        depth, items, current = 0, [], ""
        for character in payload:  # the top-level items: commas outside parentheses
            depth += {"(": 1, ")": -1}.get(character, 0)
            if character == "," and depth == 0:
                items.append(current)
                current = ""
            else:
                current += character
        items.append(current)
        keys = {re.search(r"`([^`]+)`", item)[1] for item in items}
        label_names = {label for label in re.findall(r"`([^`]+)`", labels) if "." in label}
        table[name.strip("`")] = (label_names, keys)
    return table


@flow(name="checkpoint-events")
def checkpoint_flow_events(checkpoint: str, evaluation: dict[str, Any]) -> None:
    """The events the checkpoint flows and the cleanup hook emit, through the same functions
    (their call sites: tests/flows/checkpoints/, tests/e2e/test_checkpoints.py)."""
    events.checkpoint_evaluated(checkpoint, 1, evaluation)
    events.promotion_decided(checkpoint, False, "not yet", None)
    events.run_released(events.root_flow_run_id(), events.root_flow_run_id(), "Failed", 1)
    lineage = Lineage(  # a fork's (its call site: tests/flows/core/test_forks.py)
        kind="fork",
        parent_run_id=checkpoint_run_id(checkpoint),
        parent_checkpoint=checkpoint,
        cycle=1,
        parent_flow_run_id=None,
        changes={"learning_rate": Change(parent=0.002, fork=0.02)},
    )
    events.run_forked("run-fork", lineage.model_dump(mode="json"))


def test_every_event_is_the_guides(
    checkpointed_run: CheckpointedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, result = checkpointed_run.config, checkpointed_run.result
    emitted = list(checkpointed_run.events)
    real = events.emit_event

    def record(event: str, **options: Any) -> Any:
        emitted.append({"event": event, **options})
        return real(event, **options)

    monkeypatch.setattr(events, "emit_event", record)
    root = f"prefect.flow-run.{checkpointed_run.flow_run_id}"
    trained = [event for event in emitted if event["resource"]["prefect.resource.id"] == root]
    cycle = ["whitney.cycle.started", "whitney.cycle.completed", "whitney.checkpoint.saved"]
    assert [event["event"] for event in trained] == cycle * 3 + ["whitney.run.finished"]
    cycles = [e for e in trained if e["event"].startswith("whitney.cycle.")]
    for started, completed in zip(cycles[::2], cycles[1::2], strict=True):
        assert started["payload"]["stall_window_s"] == completed["payload"]["stall_window_s"]
        assert completed["follows"] is not None
    assert trained[1]["payload"]["metrics"]["eval.pass_at_k"] == result.cycles[0].eval.pass_at_k
    assert trained[-1]["payload"]["adapter_sha256"] == result.adapter.sha256
    assert trained[-2]["payload"]["checkpoint"] == result.checkpoint
    assert trained[-2]["payload"]["evaluation"] == config.eval_settings().model_dump()

    checkpoint_flow_events(result.checkpoint, result.cycles[-1].eval.model_dump())

    table = guide_table()
    # a sweep's and resume-run's own events: tests/e2e/test_sweeps.py, tests/e2e/test_resume.py
    elsewhere = {events.SWEEP_BEST, events.RUN_RESUMED, events.RUN_NOT_RESUMED}
    assert {event["event"] for event in emitted} == set(table) - elsewhere
    for event in emitted:
        labels, keys = table[event["event"]]
        assert set(event["payload"]) == keys, event["event"]
        assert set(event["resource"]) - {"prefect.resource.id"} == labels, event["event"]
        assert event["resource"]["prefect.resource.id"].startswith("prefect.flow-run.")
    released = [event for event in emitted if event["event"] == "whitney.run.released"]
    assert released and released[0]["resource"][events.STALL_WINDOW_LABEL] == events.ALL_WINDOWS
    assert set(events.EVENTS) == set(table)
