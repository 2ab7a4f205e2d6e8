"""One trial at one rung: a flow run of the trial flow's deployment, holding a slot of the
sweep's global concurrency limit while it runs and until its usage (Whitney's journal) is
settled in the sweep's ledger, then read back from Prefect's events (its cycles' metrics,
its final checkpoint).

A trial's flow run is named `{sweep}-trial-{i}-rung-{r}`, tagged with the sweep's flow run id
and created with an idempotency key of both: a retried sweep flow run finds the trial flow
runs that already ended and reads them back instead of starting them again, and attaches to
one still running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from prefect import get_client, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterName,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import TERMINAL_STATES, FlowRun
from prefect.client.schemas.sorting import FlowRunSort
from prefect.concurrency.sync import concurrency
from prefect.deployments import run_deployment
from prefect.events.filters import (
    EventAnyResourceFilter,
    EventFilter,
    EventNameFilter,
    EventOccurredFilter,
)
from prefect.states import Cancelling
from pydantic import BaseModel, Field

from blocks.connection import WhitneyConnection
from flows.core.loop.cost import CostModel, Usage, add_usage, total_tokens, usage_of
from flows.core.records.events import CYCLE_COMPLETED, RUN_FINISHED
from flows.sweep.ledger import CostLedger
from flows.sweep.results import SKIPPED, TrialRung
from tasks.names import CYCLE_CHECKPOINT, FLOW_RUN_LABEL
from tasks.release import release_sessions

SWEEP_TAG = "whitney.sweep"
EVENT_WAIT_S = 60.0
"""How long a finished trial's events may take to reach the API (they are written in batches)."""
POLL_S = 1.0


class TrialRequest(BaseModel):
    """Everything a trial task needs: where it runs, its config, its name."""

    trial: int
    rung: int
    cycles: int
    deployment: str
    parameters: dict[str, Any]
    flow_run_name: str
    sweep_flow_run_id: str
    concurrency_limit: str
    metric: str
    first_cycle: int = Field(description="The rung's first cycle (0, or after resume_from)")
    timeout_s: float

    @property
    def tag(self) -> str:
        return f"{SWEEP_TAG}:{self.sweep_flow_run_id}"


def ended_trial_run(prefect: SyncPrefectClient, request: TrialRequest) -> FlowRun | None:
    """The trial's flow run of this sweep if one already ended (a retried sweep), the last to
    end."""
    runs = prefect.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[request.tag]),
            name=FlowRunFilterName(any_=[request.flow_run_name]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(TERMINAL_STATES))),
        ),
        sort=FlowRunSort.END_TIME_DESC,
        limit=1,
    )
    return runs[0] if runs else None


def start_and_wait(
    prefect: SyncPrefectClient,
    request: TrialRequest,
    ledger: CostLedger,
    connection: WhitneyConnection,
    prices: CostModel | None,
) -> tuple[FlowRun, Usage] | None:
    """Run the trial's flow run to its end (cancelled after `timeout_s`) holding a slot, and
    settle its cost before giving the slot back, so a trial waiting for it sees that cost;
    None if, once it has the slot, the budget leaves no room for it."""
    with concurrency(request.concurrency_limit, occupy=1):
        if not ledger.reserve(request.flow_run_name, request.cycles - request.first_cycle):
            return None
        flow_run: FlowRun = run_deployment(
            request.deployment,
            parameters=request.parameters,
            flow_run_name=request.flow_run_name,
            tags=[SWEEP_TAG, request.tag],
            idempotency_key=f"{request.sweep_flow_run_id}:{request.flow_run_name}",
            timeout=request.timeout_s,
            poll_interval=POLL_S,
            as_subflow=True,
        )
        if flow_run.state is not None and not flow_run.state.is_final():
            get_run_logger().warning("%s ran out of time: cancelling it", request.flow_run_name)
            prefect.set_flow_run_state(flow_run.id, Cancelling(), force=True)
            while not (state := prefect.read_flow_run(flow_run.id).state) or not state.is_final():
                time.sleep(POLL_S)
            flow_run = prefect.read_flow_run(flow_run.id)
        return flow_run, settled(request, flow_run, connection, prices, ledger)


def trial_events(
    prefect: SyncPrefectClient, flow_run: FlowRun, wanted: Callable[[list[Any]], bool]
) -> list[Any]:
    """The cycle and finish events about `flow_run`, once `wanted(events)` or after
    EVENT_WAIT_S."""
    since = (flow_run.created or flow_run.expected_start_time) - timedelta(minutes=1)
    query = EventFilter(
        event=EventNameFilter(name=[CYCLE_COMPLETED, RUN_FINISHED]),
        any_resource=EventAnyResourceFilter(id=[f"prefect.flow-run.{flow_run.id}"]),
        occurred=EventOccurredFilter(since=since),
    )
    deadline = time.monotonic() + EVENT_WAIT_S
    while True:
        page = prefect.read_events(filter=query, limit=50)  # the API's most
        events = list(page.events)
        while page.next_page is not None:
            page = prefect.read_events_page(str(page.next_page))
            events.extend(page.events)
        if wanted(events) or time.monotonic() >= deadline:
            return sorted(events, key=lambda event: event.occurred)
        time.sleep(POLL_S)


def whitney_usage(connection: WhitneyConnection, flow_run_id: str, timeout_s: float) -> Usage:
    """Release what the flow run still holds on Whitney (nothing, after a normal end), and
    the usage of every run of its sessions."""
    usage: Usage = {}
    with connection.get_client() as client:
        release_sessions(client, flow_run_id, timeout_s, get_run_logger())
        for session in client.list_sessions(label=f"{FLOW_RUN_LABEL}:{flow_run_id}"):
            for run_id in client.get_session(session.session_id).run_ids or []:
                add_usage(usage, usage_of(client.iter_journal(run_id)))
    return usage


def priced(prices: CostModel | None, usage: Usage) -> float | None:
    """The usage's estimated USD; None without a price table."""
    return prices.cost(usage) if prices is not None else None


def settled(
    request: TrialRequest,
    flow_run: FlowRun,
    connection: WhitneyConnection,
    prices: CostModel | None,
    ledger: CostLedger,
) -> Usage:
    """The ended flow run's usage on Whitney, its cost entered in the sweep's ledger."""
    usage = whitney_usage(connection, str(flow_run.id), 60.0)
    ledger.settle(
        request.flow_run_name, priced(prices, usage), request.cycles - request.first_cycle
    )
    return usage


def cycles_ran(request: TrialRequest, checkpoint: str | None) -> int:
    """How many cycle events a completed trial leaves: up to its final checkpoint's cycle,
    fewer than its rung's when its own budget stopped it early."""
    match = CYCLE_CHECKPOINT.match(checkpoint or "")
    last = int(match["cycle"]) if match else request.cycles - 1
    return last + 1 - request.first_cycle


def read_back(
    prefect: SyncPrefectClient,
    request: TrialRequest,
    flow_run: FlowRun,
    usage: Usage,
    prices: CostModel | None,
) -> TrialRung:
    """The trial's rung from its flow run's records and its usage."""
    completed = flow_run.state is not None and flow_run.state.is_completed()

    def wanted(events: list[Any]) -> bool:
        if not completed:
            return True
        finished = [event.payload for event in events if event.event == RUN_FINISHED]
        cycles = {event.payload["cycle"] for event in events if event.event == CYCLE_COMPLETED}
        return bool(finished) and len(cycles) >= cycles_ran(request, finished[-1]["checkpoint"])

    events = trial_events(prefect, flow_run, wanted)
    by_cycle = {
        int(event.payload["cycle"]): event.payload.get("metrics", {}).get(request.metric)
        for event in events
        if event.event == CYCLE_COMPLETED
    }
    curve = [
        (cycle, float(value)) for cycle, value in sorted(by_cycle.items()) if value is not None
    ]
    finished = [event.payload for event in events if event.event == RUN_FINISHED]
    checkpoint = finished[-1]["checkpoint"] if finished and completed else None
    state = flow_run.state.type.value if flow_run.state is not None else "UNKNOWN"
    return TrialRung(
        trial=request.trial,
        rung=request.rung,
        cycles=request.cycles,
        flow_run_id=str(flow_run.id),
        flow_run_name=flow_run.name,
        state=state,
        curve=curve,
        score=curve[-1][1] if checkpoint and curve else None,
        run_id=finished[-1]["run_id"] if finished else None,
        checkpoint=checkpoint,
        usage=usage,
        cost=priced(prices, usage),
        started=flow_run.start_time.timestamp() if flow_run.start_time else None,
        ended=flow_run.end_time.timestamp() if flow_run.end_time else None,
    )


@task(
    name="trial", task_run_name="trial-{request.trial}-rung-{request.rung}", cache_policy=NO_CACHE
)
def run_trial(
    request: TrialRequest,
    connection: WhitneyConnection,
    prices: CostModel | None,
    ledger: CostLedger,
) -> TrialRung:
    """The trial's rung: its flow run (started, or the one a previous attempt ended), read
    back; SKIPPED if the budget has no room for it."""
    logger = get_run_logger()
    with get_client(sync_client=True) as prefect:
        flow_run = ended_trial_run(prefect, request)
        if flow_run is None:
            ran = start_and_wait(prefect, request, ledger, connection, prices)
        else:
            logger.info("%s already ended: reading it back", request.flow_run_name)
            ran = flow_run, settled(request, flow_run, connection, prices, ledger)
        if ran is None:
            logger.warning("%s: not started, over the sweep's max_cost", request.flow_run_name)
            return TrialRung(
                trial=request.trial,
                rung=request.rung,
                cycles=request.cycles,
                flow_run_name=request.flow_run_name,
                state=SKIPPED,
            )
        rung = read_back(prefect, request, *ran, prices)
    logger.info(
        "%s: %s, %s = %s, %s tokens",
        request.flow_run_name,
        rung.state,
        request.metric,
        rung.score,
        f"{total_tokens(rung.usage):,}",
    )
    return rung
