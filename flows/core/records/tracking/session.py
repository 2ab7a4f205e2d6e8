"""The interface the cycle kit calls: a flow run's tracked run on every backend its config
names, fed by the records (flows.core.records.run_records) and ended by the flows' hooks.

    tracking = open_tracking(config, whitney_block)    in run_cycles, before the first cycle
    tracking.log_cycle(cycle, row)                     each cycle's metrics, the cycle as step
    tracking.log_summary(markdown, png)                the summary and the learning curves
    end_tracking(flow, flow_run, state)                on_completion / failure / crash /
                                                       cancellation: the exported adapter's
                                                       metadata and results, then the status

A flow run's tracking stays open from its first cycle to its end (a retry in the same process
finds it open); the hooks find it by flow run id. A tracker never fails the training: a
setting it refuses is refused before the first cycle (flows.core.records.tracking.preflight, and by
`whitney-flows run` before anything starts); every call is delivered by the tracker's own
thread (flows.core.records.tracking.delivery), retried while the tracker cannot be reached, and what
a tracker missed is the flow run's `<flow>-<flow run>-tracking-gaps` artifact (`record_gaps`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from prefect import Flow, get_client, get_run_logger
from prefect.client.schemas.actions import ArtifactCreate
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.logging.loggers import flow_run_logger
from prefect.states import State
from pydantic import BaseModel

from blocks.endpoint import resolve_connection
from flows.core.config import FlowConfig
from flows.core.records.lineage import Lineage, branches
from flows.core.records.run_records import artifact_key
from flows.core.records.tracking.backend import RunStatus, TrackedRunSpec, Tracker
from flows.core.records.tracking.config import Backend
from flows.core.records.tracking.delivery import Call, Delivery, Gap, finish_deadline
from flows.core.records.tracking.lineage import lineage_key
from flows.core.records.tracking.params import config_params, redacted, text, without_credentials
from flows.core.records.tracking.preflight import check_tracking

ADAPTER_FIELDS = ("session_id", "run_id", "checkpoint", "resumed_from", "adapter")
"""What every training flow's result says about its exported adapter (TrainingResult)."""
RECORD_FIELDS = ("manifest", "lineage")
"""The result's records of what made the adapter, each logged as a JSON file of its name."""
OPEN: dict[UUID, Tracking] = {}
"""The open tracking of each flow run of this process."""


def start_backend(backend: Backend, spec: TrackedRunSpec) -> Tracker:
    """The tracker of `backend`, started or continued (its package imported now)."""
    if backend == "mlflow":
        from flows.core.records.tracking.mlflow_tracker import MlflowTracker

        return MlflowTracker(spec)
    if backend == "tensorboard":
        from flows.core.records.tracking.tensorboard_tracker import TensorBoardTracker

        return TensorBoardTracker(spec)
    from flows.core.records.tracking.wandb_tracker import WandbTracker

    return WandbTracker(spec)


def numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a row (not booleans, not the cycle's bookkeeping)."""
    skip = {"cycle", "seq_start", "seq_end"}
    return {
        name: float(value)
        for name, value in row.items()
        if name not in skip
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def clock(seconds: float) -> str:
    """A wall-clock time as the tracking gaps show it."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(seconds))


def gap_text(gap: Gap) -> str:
    """A tracker's gap, once the run has ended, in a sentence."""
    if gap.lost:
        lost = ", ".join(gap.lost)
        return f"unreachable from {clock(gap.started)} ({gap.error}): never got the {lost}"
    return (
        f"unreachable {clock(gap.started)} to {clock(gap.ended or gap.started)} "
        f"({gap.error}); {gap.late} calls delivered late"
    )


class Tracking:
    """One tracked run on each chosen backend; every call goes to each of them, through the
    backend's delivery thread."""

    def __init__(self, trackers: Mapping[Backend, Tracker], logger: logging.LoggerAdapter) -> None:
        """`trackers`: started ones (one still to start is `add`ed)."""
        self.deliveries: dict[Backend, Delivery] = {}
        self.logger = logger
        self.step = 0
        """The last cycle logged: the step of the results logged at the end."""
        for backend, tracker in trackers.items():
            self.add(backend, lambda started=tracker: started)

    def add(self, backend: Backend, start: Callable[[], Tracker]) -> None:
        """Send everything to `backend` too, whose tracker `start` starts in its delivery
        thread (retried like any call)."""
        self.deliveries[backend] = Delivery(backend, start, self.report)

    def report(self, level: int, message: str) -> None:
        """A delivery's warning or notice, in the flow run's log."""
        self.logger.log(level, "Tracking: %s", message)

    def each(self, what: str, call: Call) -> None:
        """`call` on every tracker, delivered in the background (a failure never raises)."""
        for delivery in self.deliveries.values():
            delivery.submit(what, call)

    def gaps_markdown(self) -> str | None:
        """What a tracker missed, was late with or refused, as a markdown table; None if
        nothing."""
        rows = []
        for backend, delivery in self.deliveries.items():
            rows += [(backend, gap_text(gap)) for gap in delivery.gaps]
            rows += [(backend, f"refused the {what}") for what in delivery.dropped]
        if not rows:
            return None
        lines = ["# Tracking gaps", "", "| tracker | what happened |", "| --- | --- |"]
        return "\n".join(lines + [f"| {backend} | {text} |" for backend, text in rows])

    def log_cycle(self, cycle: int, row: Mapping[str, Any]) -> None:
        """A cycle's metrics row (flows.core.records.run_records.metrics_row), the cycle as step."""
        self.step = max(self.step, cycle)
        metrics = numbers(row)
        self.each("metrics", lambda tracker: tracker.log_metrics(metrics, cycle))

    def log_summary(self, markdown: str, png: bytes | None) -> None:
        """The flow's summary table and its learning curves."""
        content = without_credentials(markdown).encode()
        self.each("summary", lambda tracker: tracker.log_file("summary.md", content))
        if png is not None:
            self.each("picture", lambda tracker: tracker.log_file("learning_curves.png", png))

    def log_result(self, result: Any) -> None:
        """What the flow returned: the exported adapter's metadata (a file and tags) and the
        final results (the top-level numbers and those one level down, e.g. eval losses), with
        nothing secret (flows.core.records.tracking.params.redacted)."""
        if not isinstance(result, BaseModel):
            return
        dumped = redacted(result.model_dump(mode="json"))
        adapter = {name: dumped[name] for name in ADAPTER_FIELDS if name in dumped}
        if "adapter" in adapter:
            content = json.dumps(adapter, indent=2, sort_keys=True).encode()
            self.each("adapter", lambda tracker: tracker.log_file("adapter.json", content))
        for name in RECORD_FIELDS:
            if dumped.get(name):
                record = json.dumps(dumped[name], indent=2, sort_keys=True).encode()
                self.each(name, lambda tracker, r=record, n=name: tracker.log_file(f"{n}.json", r))
        tags = {
            f"whitney.{name}": text(value)
            for name, value in adapter.items()
            if isinstance(value, str)
        }
        exported = adapter.get("adapter") or {}
        tags.update((f"whitney.adapter.{name}", text(value)) for name, value in exported.items())
        self.each("tags", lambda tracker: tracker.set_tags(tags))
        finals = numbers({f"final.{name}": value for name, value in dumped.items()})
        for name, value in dumped.items():
            if isinstance(value, dict) and name not in ADAPTER_FIELDS + RECORD_FIELDS:
                finals.update(numbers({f"final.{name}.{k}": v for k, v in value.items()}))
        if finals:
            self.each("results", lambda tracker: tracker.log_metrics(finals, self.step))

    def finish(self, status: RunStatus) -> None:
        """End the tracked runs, waiting a bounded time for what is undelivered; what never
        went through is warned about."""
        self.each("end", lambda tracker: tracker.finish(status))
        deadline = finish_deadline()
        for backend, delivery in self.deliveries.items():
            if lost := delivery.close(deadline):
                self.logger.warning("Tracking: %s never got the %s", backend, ", ".join(lost))


def open_tracking(
    config: FlowConfig, whitney_block: str | None, lineage: Lineage | None = None
) -> Tracking:
    """The running flow run's tracking: the one already open (a retry in this process), or
    the tracked run of its lineage started or continued on every backend `config.tracking`
    names, with the config as params. A fork that branches (flows.core.records.lineage.branches)
    starts its own tracked run, tagged with its parent. No backend: a Tracking that sends
    nothing."""
    context = FlowRunContext.get()
    flow_run = context.flow_run
    if flow_run.id in OPEN:
        return OPEN[flow_run.id]
    logger = get_run_logger()
    settings = config.tracking
    tracking = Tracking({}, logger)
    if not settings.backends:
        return tracking
    check_tracking(settings, reach=False)
    if branches(lineage):
        key = str(flow_run.id)
    else:
        connection = (
            resolve_connection(config.api_url, whitney_block) if config.resume_from else None
        )
        key = lineage_key(flow_run, config.resume_from, connection)
    spec = TrackedRunSpec(key=key, name=f"{context.flow.name}-{flow_run.name}", settings=settings)
    for backend in settings.backends:
        tracking.add(backend, functools.partial(start_backend, backend, spec))
    OPEN[flow_run.id] = tracking
    tracking.each("params", lambda tracker: tracker.log_params(config_params(config)))
    tags = {"prefect.flow_run_id": str(flow_run.id), "prefect.flow_run_name": flow_run.name}
    if branches(lineage):
        tags |= fork_tags(lineage)
    tracking.each("tags", lambda tracker: tracker.set_tags(tags))
    logger.info("Tracking to %s (lineage %s)", ", ".join(settings.backends), key)
    return tracking


def fork_tags(lineage: Lineage) -> dict[str, str]:
    """A branching fork's tags: its parent run, flow run and cycle, and what changed."""
    changes = {
        field: change.model_dump(mode="json") for field, change in (lineage.changes or {}).items()
    }
    return {
        "whitney.fork.parent_run_id": lineage.parent_run_id,
        "whitney.fork.parent_flow_run_id": lineage.parent_flow_run_id or "",
        "whitney.fork.cycle": str(lineage.cycle),
        "whitney.fork.changes": text(json.dumps(changes, sort_keys=True)),
    }


def end_tracking(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """The flows' hook on every ending: a completed flow run's result is logged, then every
    tracker ends with the status (FINISHED, KILLED when cancelled, else FAILED). Nothing to do
    for a flow run with no tracking open here; never raises past Prefect."""
    tracking = OPEN.pop(flow_run.id, None)
    if tracking is None:
        return
    tracking.logger = flow_run_logger(flow_run, flow)
    try:
        if state.is_completed():
            tracking.log_result(state.result(raise_on_failure=False))
            status: RunStatus = "FINISHED"
        else:
            status = "KILLED" if state.is_cancelled() else "FAILED"
        tracking.finish(status)
        if (markdown := tracking.gaps_markdown()) is not None:
            record_gaps(flow, flow_run, markdown)
    except Exception as error:
        tracking.logger.error("Ending the tracked run failed: %r", error)


def record_gaps(flow: Flow[..., Any], flow_run: FlowRun, markdown: str) -> None:
    """The flow run's `<flow>-<flow run>-tracking-gaps` artifact: what its trackers missed."""
    artifact = ArtifactCreate(
        type="markdown",
        key=artifact_key(flow.name, flow_run.name, "tracking-gaps"),
        description="What the experiment trackers missed while they could not be reached",
        flow_run_id=flow_run.id,
        data=markdown,
    )
    with get_client(sync_client=True) as prefect:
        prefect.create_artifact(artifact)
