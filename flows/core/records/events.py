"""The Prefect events the flows emit (names and payloads: docs/evaluation.md, *Events*).

Every event's resource is the top-level flow run, `prefect.flow-run.<id>` (a subflow's too: an
SFT teacher's events are its distillation's), so an automation can act on it:

    whitney.cycle.started      a cycle begins; its stall window (flows.core.loop.stall_windows)
    whitney.cycle.completed    a cycle's key metrics (its table row, with `eval.*`)
    whitney.checkpoint.saved   a `save_state` checkpoint: URI, run, cycle, and the eval
                               settings of the flow (what evaluate-checkpoint samples)
    whitney.run.finished       the run's normal end: adapter sha256, the export command
    whitney.run.forked         a run created from another run's checkpoint (`resume_from`):
                               its parent, the cycle, what changed (flows.core.records.lineage)
    whitney.run.released       the cleanup hook released the flow run's Whitney sessions
    whitney.checkpoint.evaluated   evaluate-checkpoint's numbers for a checkpoint
    whitney.promotion.decided      promote-checkpoint's decision: approved or not, the note
    whitney.sweep.best         a sweep's best trial: its values, metric and checkpoint
    whitney.run.resumed        resume-run started a flow run continuing a crashed one
    whitney.run.not-resumed    resume-run left a crashed or failed flow run alone, and why

A cycle's started and completed events carry the label `whitney.stall-window-s` (its window);
the stall automation of that window starts its clock at `started` and is satisfied by
`completed`. `released` carries `all`, which satisfies every window's automation, so a flow run
that failed mid-cycle is not cancelled later (its retry would be). Each cycle event `follows`
the one before, so Prefect evaluates them in order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from prefect.events import Event, emit_event
from prefect.runtime import flow_run as current_flow_run

from flows.core.evaluation.config import EvalSettings
from flows.core.loop.stall_windows import StallSettings, stall_window
from tasks.names import CYCLE_CHECKPOINT
from whitney.uris import checkpoint_run_id

CYCLE_STARTED = "whitney.cycle.started"
CYCLE_COMPLETED = "whitney.cycle.completed"
CHECKPOINT_SAVED = "whitney.checkpoint.saved"
RUN_FINISHED = "whitney.run.finished"
RUN_RELEASED = "whitney.run.released"
RUN_FORKED = "whitney.run.forked"
CHECKPOINT_EVALUATED = "whitney.checkpoint.evaluated"
PROMOTION_DECIDED = "whitney.promotion.decided"
SWEEP_BEST = "whitney.sweep.best"
RUN_RESUMED = "whitney.run.resumed"
RUN_NOT_RESUMED = "whitney.run.not-resumed"
EVENTS = (
    CYCLE_STARTED,
    CYCLE_COMPLETED,
    CHECKPOINT_SAVED,
    RUN_FINISHED,
    RUN_RELEASED,
    RUN_FORKED,
    CHECKPOINT_EVALUATED,
    PROMOTION_DECIDED,
    SWEEP_BEST,
    RUN_RESUMED,
    RUN_NOT_RESUMED,
)
"""Every event the flows emit (docs/evaluation.md, *Events*)."""
STALL_WINDOW_LABEL = "whitney.stall-window-s"
ALL_WINDOWS = "all"
"""The stall label of `whitney.run.released`: every window's automation counts it."""
EVALUABLE_LABEL = "whitney.evaluable"
"""`true` on a checkpoint event that carries eval settings (what the evaluate trigger matches)."""


def flow_run_resource(flow_run_id: UUID | str, **labels: str) -> dict[str, str]:
    """The resource of every event here: a flow run, with `labels`."""
    return {"prefect.resource.id": f"prefect.flow-run.{flow_run_id}", **labels}


def whitney_run(run_id: str) -> dict[str, str]:
    """A Whitney run as a related resource."""
    return {"prefect.resource.id": f"whitney.run.{run_id}", "prefect.resource.role": "whitney-run"}


def root_flow_run_id() -> str:
    """The top-level flow run of the current one (itself when it has no parent)."""
    return current_flow_run.root_flow_run_id


def run_event(
    name: str, payload: dict[str, Any], runs: tuple[str | None, ...], **labels: str
) -> Event | None:
    """Event `name` of the top-level flow run (with `labels`), related to the Whitney runs
    `runs` (an empty one left out)."""
    return emit_event(
        name,
        resource=flow_run_resource(root_flow_run_id(), **labels),
        related=[whitney_run(run_id) for run_id in runs if run_id],
        payload=payload,
    )


def checkpoint_saved(checkpoint: str, evaluation: EvalSettings | None) -> Event | None:
    """`whitney.checkpoint.saved` for a `save_state` checkpoint URI of the current flow run."""
    match = CYCLE_CHECKPOINT.match(checkpoint)
    run_id = checkpoint_run_id(checkpoint)
    payload = {
        "checkpoint": checkpoint,
        "run_id": run_id,
        "cycle": int(match["cycle"]) if match else None,
        "flow_run_id": str(current_flow_run.id),
        "evaluation": evaluation.model_dump() if evaluation is not None else None,
    }
    evaluable = str(evaluation is not None).lower()
    return run_event(CHECKPOINT_SAVED, payload, (run_id,), **{EVALUABLE_LABEL: evaluable})


def run_finished(
    run_id: str, checkpoint: str, sha256: str, artifact_id: str, export: str
) -> Event | None:
    """`whitney.run.finished`: the trained run ended normally with an exported adapter."""
    payload = {
        "run_id": run_id,
        "checkpoint": checkpoint,
        "adapter_sha256": sha256,
        "adapter_artifact_id": artifact_id,
        "export_command": export,
        "flow_run_id": str(current_flow_run.id),
    }
    return run_event(RUN_FINISHED, payload, (run_id,))


def run_forked(run_id: str, lineage: Mapping[str, Any]) -> Event | None:
    """`whitney.run.forked`: the run was created from another run's checkpoint; `lineage`:
    its parent, cycle and changes (flows.core.records.lineage.Lineage, as JSON)."""
    parent = whitney_run(lineage["parent_run_id"]) | {"prefect.resource.role": "parent-run"}
    return emit_event(
        RUN_FORKED,
        resource=flow_run_resource(root_flow_run_id()),
        related=[whitney_run(run_id), parent],
        payload={"run_id": run_id, "flow_run_id": str(current_flow_run.id), **lineage},
    )


def run_released(root_id: UUID | str, flow_run_id: UUID | str, state: str, sessions: int) -> None:
    """`whitney.run.released`, from a cleanup hook (no run context: the ids are given)."""
    emit_event(
        RUN_RELEASED,
        resource=flow_run_resource(root_id, **{STALL_WINDOW_LABEL: ALL_WINDOWS}),
        related=[
            {
                "prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
                "prefect.resource.role": "flow-run",
            }
        ],
        payload={"flow_run_id": str(flow_run_id), "state": state, "sessions_closed": sessions},
    )


def checkpoint_evaluated(
    checkpoint: str, cycle: int | None, evaluation: Mapping[str, Any]
) -> Event | None:
    """`whitney.checkpoint.evaluated`: a checkpoint's numbers (evaluate-checkpoint)."""
    run_id = checkpoint_run_id(checkpoint)
    payload = {
        "checkpoint": checkpoint,
        "run_id": run_id,
        "cycle": cycle,
        "evaluation": dict(evaluation),
    }
    return run_event(CHECKPOINT_EVALUATED, payload, (run_id,))


def promotion_decided(
    checkpoint: str, approved: bool, note: str, target_dir: str | None
) -> Event | None:
    """`whitney.promotion.decided`: a person's decision on promoting a checkpoint."""
    payload = {
        "checkpoint": checkpoint,
        "approved": approved,
        "note": note,
        "target_dir": target_dir,
    }
    return run_event(PROMOTION_DECIDED, payload, (checkpoint_run_id(checkpoint),))


def sweep_best(
    trial: int,
    params: Mapping[str, Any],
    metric: str,
    value: float | None,
    checkpoint: str | None,
    flow_run_id: str | None,
) -> Event | None:
    """`whitney.sweep.best`: the sweep's best trial, its last flow run and checkpoint."""
    run_id = checkpoint_run_id(checkpoint) if checkpoint else None
    payload = {
        "trial": trial,
        "params": dict(params),
        "metric": metric,
        "value": value,
        "checkpoint": checkpoint,
        "run_id": run_id,
        "flow_run_id": flow_run_id,
    }
    return run_event(SWEEP_BEST, payload, (run_id,))


class CycleEvents:
    """The started and completed events of one flow run's cycles, each cycle with its stall
    window from the cycles before it (their wall time as the loop saw it)."""

    def __init__(self, stall: StallSettings) -> None:
        self.stall = stall
        self.root = root_flow_run_id()
        self.cycle_seconds: list[float] = []
        self._window = 0
        self._started = 0.0
        self._last: Event | None = None

    def started(self, cycle: int) -> None:
        self._window = stall_window(self.stall, self.cycle_seconds)
        self._started = time.monotonic()
        recent = self.cycle_seconds[-self.stall.recent_cycles :]
        self._emit(
            CYCLE_STARTED,
            {
                "cycle": cycle,
                "stall_window_s": self._window,
                "recent_cycle_s": sum(recent) / len(recent) if recent else None,
            },
        )

    def completed(self, cycle: int, row: Mapping[str, Any]) -> None:
        """`row`: the cycle's table row (`flows.core.records.run_records.metrics_row`)."""
        seconds = time.monotonic() - self._started
        self.cycle_seconds.append(seconds)
        payload = {"cycle": cycle, "seconds": seconds, "stall_window_s": self._window}
        self._emit(CYCLE_COMPLETED, {**payload, "metrics": dict(row)})

    def _emit(self, name: str, payload: dict[str, Any]) -> None:
        resource = flow_run_resource(self.root, **{STALL_WINDOW_LABEL: str(self._window)})
        self._last = emit_event(name, resource=resource, payload=payload, follows=self._last)
