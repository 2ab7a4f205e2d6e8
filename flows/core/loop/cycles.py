"""The cycle kit every training flow (RL, SFT, distillation) shares: the one outer loop, its
cycles as subflow runs in order, the body of every cycle subflow, and the calls every cycle
makes around its own middle.

    ran = run_cycles(rl_cycle, config, range(first, config.cycles), seq_ids, whitney_block,
                     records=records, guard=guard, run_id=run_id, auxiliary=auxiliary)

The loop carries the seq ids: each cycle subflow is called as `cycle(config, n, start,
whitney_block, **arguments)`, where `start` (a `CycleStart`) holds every run's next seq id
(from `seq_ids` for the first cycle, then from where the cycle before ended: its
`seq_ends`), and the sample requests earlier cycles made for it and later ones (off-policy).
`arguments` are the same for every cycle (the run ids). A cycle subflow's body is
`run_cycle_subflow`: its ordered calls from `start`, its work, where it ended, its record.

Around each cycle the loop does what every flow needs: between cycles it stops if the flow run
was asked to cancel or the budget says the next cycle would go over; after each, it adds the
cycle's cost and writes its records (flows.core.records.run_records: the metrics line, the progress
artifact, and the experiment trackers the config names: flows.core.records.tracking).
A cycle, and the check between cycles, ride out a Prefect API outage: made again once the API
answers (flows.core.orchestration.orchestrator), with one line in the log when it goes and one when
it is back.

The calls around a cycle's middle:

    publish_sampler    save_weights_for_sampler, named `cycle-{n}` or unnamed -> sampler id
    sampler_calls      [the named sampler's publication +] one call per payload on it
    run_tail           forward_backward, optim_step, [save_state cycle-{n}],
                       [save_weights_for_sampler cycle-{n+1}]: together or one by one

Submitted together, a block's calls take consecutive seq ids and are awaited at once; one by
one, they take the same ids. The server runs a run's operations strictly in seq order, so the
results, and the adapter, are the same either way (docs/api.md, *Ordering and exactly-once*).

Prefect 3.9 leaves a local (not deployed) flow run asked to cancel in Cancelling and lets its
body run to the end; only then does `on_cancellation` fire. So the loop reads its flow run's
state at each cycle boundary and raises `CancellationRequested`; the hook then cancels the
Whitney run at once. (A deployed run is killed by its runner, whose `on_cancellation` does the
same.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar
from uuid import UUID

from prefect import Flow, flow, get_client, get_run_logger
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from pydantic import BaseModel, Field

from blocks.endpoint import resolve_connection
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
from flows.core.records.run_records import RunRecords, by_run, metrics_row, record_cycle
from flows.core.records.tracking.session import open_tracking
from tasks.names import cycle_name
from tasks.sequenced_client import Call, SequencedClient
from whitney import wire


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
    start, whitney_block, **arguments)`, as `run_cycles` calls it, and runs
    `run_cycle_subflow`."""
    return flow(name=name, flow_run_name="cycle-{cycle}", persist_result=False, **CLEANUP_HOOKS)


def run_cycle_subflow(
    config: FlowConfig,
    start: CycleStart,
    whitney_block: str | None,
    names: Mapping[str, str],
    run_cycle: Callable[[SequencedClient], M],
) -> M:
    """The body of every cycle subflow: its ordered calls (each run from its seq id in
    `start`), `run_cycle` on them, where every run's next cycle starts (`seq_ends`), and the
    cycle's one artifact, its operations under their run's name in `names` (run id -> name).

    Retried by replaying: the same calls with the same seq ids, answered from the journal.
    """
    connection = resolve_connection(config.api_url, whitney_block)
    client = SequencedClient(connection, start.seq_ids, config.task_retry)
    metrics = run_cycle(client)
    ends = {run_id: client.ledger.position(run_id) for run_id in start.seq_ids}
    metrics = metrics.model_copy(update={"seq_ends": ends})
    record_cycle(metrics, by_run(client.log.operations, names), metrics.sections())
    return metrics


def publish_call(name: str) -> Call:
    """The save_weights_for_sampler that publishes the sampler `name`."""
    return Call("save_weights_for_sampler", {"name": name})


def publish_sampler(client: SequencedClient, run_id: str, cycle: int, named: bool) -> str:
    """save_weights_for_sampler for `cycle` at its start: named `cycle-{n}` or unnamed (the
    Loop building blocks' loop: the server names it); the sampler id."""
    payload = {"name": cycle_name(cycle)} if named else {}
    operation = client.execute(run_id, "save_weights_for_sampler", payload)
    return operation.result_as(wire.SamplerResult).sampler_id


def sampler_calls(
    client: SequencedClient,
    run_id: str,
    sampler_id: str,
    kind: str,
    payloads: Sequence[dict[str, Any]],
    together: bool,
    *,
    publish: bool = False,
) -> list[dict[str, Any]]:
    """One `kind` call per payload on `sampler_id`, after its publication when `publish` (the
    sampler is named, so its calls queue before it answers): one submitted block
    (`together`) or one call after another, on the same seq ids. The calls' results."""
    lead = [publish_call(sampler_id)] if publish else []
    calls = lead + [Call(kind, payload, sampler_id) for payload in payloads]
    operations = client.run_calls(run_id, calls, together)
    if publish:
        operations[0].result_as(wire.SamplerResult)
    return [operation.result or {} for operation in operations[len(lead) :]]


@dataclass(frozen=True)
class CycleTail:
    """What the end of a cycle produced."""

    backward: wire.ForwardResult
    optimized: wire.OptimStepResult
    checkpoint: str | None
    """The `cycle-{n}` checkpoint URI, when one was due."""
    next_sampler_id: str | None
    """The sampler the next cycle samples from, when this cycle published it."""


def tail_calls(
    cycle: int,
    payload: dict[str, Any],
    optimizer: dict[str, Any],
    *,
    checkpoint: bool,
    publish_next: bool,
) -> list[Call]:
    """The cycle's tail in seq order: forward_backward, optim_step, then the `cycle-{n}`
    save_state if `checkpoint`, then the `cycle-{n+1}` sampler if `publish_next`."""
    calls = [Call("forward_backward", payload), Call("optim_step", {"optimizer": optimizer})]
    if checkpoint:
        calls.append(Call("save_state", {"name": cycle_name(cycle)}))
    if publish_next:
        calls.append(publish_call(cycle_name(cycle + 1)))
    return calls


def run_tail(
    client: SequencedClient,
    run_id: str,
    cycle: int,
    payload: dict[str, Any],
    optimizer: dict[str, Any],
    *,
    checkpoint: bool = False,
    publish_next: bool = False,
    together: bool = False,
) -> CycleTail:
    """The training tail (`tail_calls`): submitted together (pipelined: one round trip) or
    one call after another."""
    calls = tail_calls(cycle, payload, optimizer, checkpoint=checkpoint, publish_next=publish_next)
    operations = client.run_calls(run_id, calls, together=together)
    by_kind = {operation.kind: operation for operation in operations}
    saved = by_kind.get("save_state")
    published = by_kind.get("save_weights_for_sampler")
    return CycleTail(
        backward=by_kind["forward_backward"].result_as(wire.ForwardResult),
        optimized=by_kind["optim_step"].result_as(wire.OptimStepResult),
        checkpoint=saved.result_as(wire.SaveStateResult).checkpoint if saved else None,
        next_sampler_id=(published.result_as(wire.SamplerResult).sampler_id if published else None),
    )


def save_checkpoint(client: SequencedClient, run_id: str, cycle: int) -> str:
    """save_state named `cycle-{n}`; its URI."""
    saved = client.execute(run_id, "save_state", {"name": cycle_name(cycle)})
    return saved.result_as(wire.SaveStateResult).checkpoint
