"""The orchestrator's side of "nothing leaks": which open Whitney sessions belong to a flow run
that is over, and closing them (the server's session leases are the other side).

A session labelled `prefect.flow-run-id=<id>` is closed when Prefect says that flow run is
Completed, Failed, Cancelled or Crashed, or does not know it at all ("gone": deleted); it is
kept while the flow run is Scheduled, Pending, Running, Cancelling or Paused. A session
without the label (or whose label is not a flow run id) is never looked at. `judge` decides
from the states alone (no Prefect); `survey` reads them from the Prefect API the environment
names; `reap` closes through `tasks.release`, as the cleanup hooks do.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, NamedTuple
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from flows.core.orchestration.cleanup import DEFAULT_CLEANUP_TIMEOUT_S
from tasks.names import FLOW_RUN_LABEL
from tasks.release import release_sessions
from whitney import wire
from whitney.client import WhitneyClient
from whitney.errors import WhitneyError

CLOSE_STATE_TYPES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})
"""The flow run states whose sessions are closed: the run is over."""
GONE = "gone"
"""The state shown for a flow run Prefect does not know."""
LOOKUP_BATCH = 100
"""Flow run ids per Prefect API query (under its default page limit of 200)."""

Action = Literal["keep", "close", "closed", "failed"]


class FlowRunState(NamedTuple):
    type: str
    """Prefect's state type: COMPLETED, RUNNING, ..."""
    name: str
    """Its name, as the UI shows it: Completed, AwaitingRetry, ..."""


@dataclass(frozen=True)
class Verdict:
    """An open labelled session, its flow run's state and what `reap` does (or did) to it."""

    session_id: str
    flow_run_id: str
    state: str
    action: Action
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def labelled_flow_run(session: wire.Session) -> UUID | None:
    """The flow run id the session is labelled with; None without one."""
    value = (session.labels or {}).get(FLOW_RUN_LABEL)
    try:
        return UUID(value) if value else None
    except ValueError:
        return None


def over(state: FlowRunState | None) -> bool:
    """Whether a flow run in `state` (None: gone) is over, so its sessions are closed."""
    return state is None or state.type in CLOSE_STATE_TYPES


def judge(sessions: Iterable[wire.Session], states: Mapping[UUID, FlowRunState]) -> list[Verdict]:
    """A verdict for each open session labelled with a flow run id: close it if that flow
    run's state (from `states`; absent: gone) is terminal or gone, else keep it."""
    verdicts = []
    for session in sessions:
        flow_run_id = labelled_flow_run(session)
        if flow_run_id is None or session.status == "closed":
            continue
        state = states.get(flow_run_id)
        verdicts.append(
            Verdict(
                session_id=session.session_id,
                flow_run_id=str(flow_run_id),
                state=GONE if state is None else state.name,
                action="close" if over(state) else "keep",
            )
        )
    return verdicts


def flow_run_states(flow_run_ids: Collection[UUID]) -> dict[UUID, FlowRunState]:
    """The state of each flow run the Prefect API knows among `flow_run_ids`."""
    ids = sorted(set(flow_run_ids))
    states: dict[UUID, FlowRunState] = {}
    with get_client(sync_client=True) as prefect:
        for start in range(0, len(ids), LOOKUP_BATCH):
            batch = ids[start : start + LOOKUP_BATCH]
            flow_runs = prefect.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=batch)), limit=len(batch)
            )
            for flow_run in flow_runs:
                if flow_run.state is not None:
                    states[flow_run.id] = FlowRunState(
                        flow_run.state.type.value, flow_run.state.name
                    )
    return states


def survey(client: WhitneyClient) -> list[Verdict]:
    """The verdicts on the client's open labelled sessions, from their flow runs' states."""
    sessions = client.list_sessions()
    flow_run_ids = {i for i in map(labelled_flow_run, sessions) if i is not None}
    return judge(sessions, flow_run_states(flow_run_ids))


def reap(
    client: WhitneyClient,
    verdicts: Iterable[Verdict],
    logger: Any,
    timeout_s: float = DEFAULT_CLEANUP_TIMEOUT_S,
) -> list[Verdict]:
    """Release the flow runs of the `close` verdicts (`tasks.release`: runs cancelled,
    sessions closed), each once its state, read again, still says it is over (a flow run
    retried since the survey is kept); the verdicts, now `closed`, `failed` with the error,
    or `keep` with the new state."""
    verdicts = list(verdicts)
    outcomes: dict[str, dict[str, Any]] = {}
    for flow_run_id in dict.fromkeys(v.flow_run_id for v in verdicts if v.action == "close"):
        state = flow_run_states([UUID(flow_run_id)]).get(UUID(flow_run_id))
        if state is not None and not over(state):
            outcomes[flow_run_id] = {"action": "keep", "state": state.name}
            continue
        try:
            release_sessions(client, flow_run_id, timeout_s, logger)
            outcomes[flow_run_id] = {"action": "closed"}
        except WhitneyError as error:
            logger.error("Could not release the sessions of flow run %s: %s", flow_run_id, error)
            outcomes[flow_run_id] = {"action": "failed", "error": str(error)}
    return [replace(verdict, **outcomes.get(verdict.flow_run_id, {})) for verdict in verdicts]
