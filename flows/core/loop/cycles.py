"""The loop every training flow (RL, SFT, distillation, DPO) shares: the one outer loop, its
cycles as subflow runs in order, and what every cycle returns and starts from. A cycle's own
calls are made on its context (flows.core.loop.context).

    ran = run_cycles(rl_cycle, config, range(first, config.cycles), seq_ids, whitney_block,
                     records=records, guard=guard, run_id=run_id, auxiliary=auxiliary)

The loop carries the seq ids: each cycle subflow is called as `cycle(config, n, start,
whitney_block, **arguments)`, where `start` (a `CycleStart`) holds every run's next seq id
(from `seq_ids` for the first cycle, then from where the cycle before ended: its
`seq_ends`), and the sample requests earlier cycles made for it and later ones (off-policy).
`arguments` are the same for every cycle (the run ids). A cycle subflow's body opens its
context (flows.core.loop.context.CycleContext: its ordered calls from `start`), runs its
work on it, and finishes it (where it ended, its record).

Around each cycle the loop does what every flow needs: between cycles it stops if the flow run
was asked to cancel or the budget says the next cycle would go over; after each, it adds the
cycle's cost and writes its records (flows.core.records.run_records: the metrics line, the progress
artifact, and the experiment trackers the config names: flows.core.records.tracking).
A cycle, and the check between cycles, ride out a Prefect API outage: made again once the API
answers (flows.core.orchestration.orchestrator), with one line in the log when it goes and one when
it is back.

The calls around a cycle's middle are the context's (flows.core.loop.context).

Prefect 3.9 leaves a local (not deployed) flow run asked to cancel in Cancelling and lets its
body run to the end; only then does `on_cancellation` fire. So the loop reads its flow run's
state at each cycle boundary and raises `CancellationRequested`; the hook then cancels the
Whitney run at once. (A deployed run is killed by its runner, whose `on_cancellation` does the
same.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar
from uuid import UUID

from prefect import Flow, flow, get_client, get_run_logger
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from pydantic import BaseModel, Field

from flows.core.config import FlowConfig
from flows.core.loop.budget import BudgetGuard
from flows.core.loop.cost import Usage
from flows.core.loop.off_policy_schedule import SampleBlock
from flows.core.orchestration.cleanup import CLEANUP_HOOKS
from flows.core.orchestration.heartbeat import subflows_without_heartbeat
from flows.core.orchestration.orchestrator import prefect_away_notice, ride_out
from flows.core.orchestration.task_runner_settings import TaskRunnerSettings
from flows.core.orchestration.task_runners import cycle_task_runners
from flows.core.records.events import CycleEvents, checkpoint_saved
from flows.core.records.lineage import Lineage
from flows.core.records.run_records import RunRecords, metrics_row
from flows.core.records.tracking.session import open_tracking


class CycleResult(BaseModel):
    """What every cycle subflow returns (its flow's metrics extend it): where the cycle
    started and where the next one starts, and its timings. The records are written from it."""

    cycle: int
    started_at: datetime = Field(description="When the cycle's work began (UTC)")
    seq_start: int = Field(description="First seq id of the cycle")
    seq_end: int = Field(description="Seq id the next cycle starts at")
    op_seconds: dict[str, float] = Field(description="Wall seconds per operation kind")
    wall_seconds: float
    seq_ends: dict[str, int] = Field(
        default_factory=dict,
        exclude=True,
        description="Run id -> the seq id the next cycle starts at, for every run of the cycle",
    )

    def sections(self) -> list[str]:
        """Markdown sections of the cycle's artifact besides its metrics (an RL cycle's turns)."""
        return []


class CycleStart(BaseModel):
    """Where a cycle starts: every run's next seq id, and what earlier cycles handed on."""

    first_cycle: int = Field(description="The flow run's first cycle")
    seq_ids: dict[str, int] = Field(description="Run id -> the cycle's first seq id on it")
    presampled: list[SampleBlock] = Field(
        default_factory=list,
        description="Sample requests earlier cycles made for this one and later ones",
    )

    def after(self, metrics: CycleResult) -> CycleStart:
        """Where the cycle after the one that returned `metrics` starts."""
        return CycleStart(
            first_cycle=self.first_cycle,
            seq_ids={**self.seq_ids, **metrics.seq_ends},
            presampled=getattr(metrics, "presampled", []),  # off-policy flows hand them on
        )


M = TypeVar("M", bound=CycleResult)
THREADS = TaskRunnerSettings()
"""The task runner of a flow whose config does not choose one: Prefect's thread pool."""


class CyclesRun(NamedTuple, Generic[M]):
    """What the loop ran: the last cycle's metrics (None: none ran), every run's next seq id
    after it, and the run's records (every cycle's metrics, in order)."""

    last: M | None
    seq_ids: dict[str, int]
    records: RunRecords


class CancellationRequested(RuntimeError):
    """The flow run was asked to cancel; raised at a cycle boundary."""


def raise_if_cancelling(prefect: SyncPrefectClient, flow_run_id: UUID) -> None:
    """CancellationRequested if the flow run is Cancelling or Cancelled."""
    state = prefect.read_flow_run(flow_run_id).state
    if state is not None and (state.is_cancelling() or state.is_cancelled()):
        raise CancellationRequested(f"flow run {flow_run_id} was asked to cancel")


def run_cycles(
    cycle: Flow[..., M],
    config: FlowConfig,
    cycles: range,
    seq_ids: Mapping[str, int],
    whitney_block: str | None,
    *,
    guard: BudgetGuard | None = None,
    estimate: Callable[[int], Usage | None] | None = None,
    lineage: Lineage | None = None,
    **arguments: Any,
) -> CyclesRun[M]:
    """Run `cycles` as subflow runs of `cycle` from the seq ids `seq_ids`, within the budget
    (`estimate`: an upper bound of a cycle's usage before the first has run), stopping on
    cancellation, tracked as the continuation or the branch of `lineage`. The records'
    artifact keys start with the flow's name (`rl` for `rl-cycle`) and the flow run's."""
    flow_run: FlowRun = FlowRunContext.get().flow_run
    flow_name = cycle.name.removesuffix("-cycle")
    tracking = open_tracking(config, whitney_block, lineage)
    records = RunRecords(f"{flow_name}-{flow_run.name}", len(cycles), config.metrics_path, tracking)
    runner_settings = config if isinstance(config, TaskRunnerSettings) else THREADS
    events = CycleEvents(config.stall)
    start = CycleStart(first_cycle=cycles.start, seq_ids=dict(seq_ids))
    last: M | None = None
    with (
        cycle_task_runners(runner_settings) as runner_for_cycle,
        subflows_without_heartbeat(),
        get_client(sync_client=True) as prefect,
        prefect_away_notice(get_run_logger().warning) as outage,
    ):
        cycle_flow = cycle.with_options(
            retries=config.cycle_retries,
            retry_delay_seconds=config.cycle_retry_delay_s,
            task_runner=runner_for_cycle(),
        )
        for number in cycles:
            ride_out(
                functools.partial(raise_if_cancelling, prefect, flow_run.id), outage, "boundary"
            )
            if guard is not None:
                bound = estimate(number) if estimate is not None else None
                if (reason := guard.stop_reason(number, estimate=bound)) is not None:
                    get_run_logger().warning("%s: saving, exporting and closing now", reason)
                    break
            events.started(number)
            metrics = ride_out(  # made again after an outage: it replays (the journal)
                functools.partial(cycle_flow, config, number, start, whitney_block, **arguments),
                outage,
                f"cycle {number}",
            )
            if guard is not None:  # the flows with a budget record the cycle's `usage`
                cost = guard.add_cycle(metrics.usage)  # type: ignore[attr-defined]
                metrics = metrics.model_copy(update={"cost": cost})
            records.add_cycle(metrics)
            events.completed(number, metrics_row(metrics, rounded=False))
            if (checkpoint := getattr(metrics, "checkpoint", None)) is not None:
                checkpoint_saved(checkpoint, config.eval_settings())
            start = start.after(metrics)
            last = metrics
    return CyclesRun(last, start.seq_ids, records)


def cycle_subflow(name: str) -> Callable[[Callable[..., M]], Flow[..., M]]:
    """The decorator of every flow's cycle subflow: flow `name`, run name `cycle-{cycle}`,
    results kept in memory only, the cleanup hooks. A cycle subflow takes `(config, cycle,
    start, whitney_block, **arguments)`, as `run_cycles` calls it, and runs its cycle on a
    `flows.core.loop.context.CycleContext`."""
    return flow(name=name, flow_run_name="cycle-{cycle}", persist_result=False, **CLEANUP_HOOKS)
