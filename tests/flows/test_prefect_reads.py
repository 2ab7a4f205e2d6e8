"""The flows' Prefect reads on the test harness's API (no Whitney): a sweep that fails cancels
every open trial of more than a page of them; after an outage every open subflow of more than
a page of them, and theirs, is marked Crashed; a retried sweep finds its trial's run that
ended, the last to end; the sweep's comparison artifact is keyed by its flow run's id (names
repeat). Prefect answers a read that names no limit with a page of
PREFECT_SERVER_API_DEFAULT_LIMIT runs (200 unless set): the module runs on a Prefect API of
its own whose page is 5 runs, so that more than a page is a few runs, not hundreds."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest
from flowtest_prefect_pages import assert_more_than_a_page, prefect_api_with_page
from prefect import get_client, task
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.actions import ArtifactCreate
from prefect.client.schemas.filters import (
    ArtifactCollectionFilter,
    ArtifactCollectionFilterKey,
)
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.states import Completed, Failed, Running

from flows.core.orchestration.orchestrator import crash_open_subflows
from flows.sweep.flow import cancel_trials, comparison_key, sweep_flow
from flows.sweep.trials import SWEEP_TAG, TrialRequest, ended_trial_run

PAGE = 5
"""The page of this module's Prefect API when a read names no limit."""


@pytest.fixture(scope="module", autouse=True)
def small_pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The module's Prefect API, whose page is PAGE runs."""
    with prefect_api_with_page(PAGE, tmp_path_factory.mktemp("prefect-reads")):
        yield


@pytest.fixture
def prefect() -> Iterator[SyncPrefectClient]:
    with get_client(sync_client=True) as client:
        yield client


@pytest.fixture
def deployment(prefect: SyncPrefectClient) -> UUID:
    """A deployment of its own for the test's flow runs."""
    flow_id = prefect.create_flow_from_name("rl")
    return prefect.create_deployment(flow_id=flow_id, name=f"reads-{uuid4().hex[:8]}")


def new_run(
    prefect: SyncPrefectClient,
    deployment: UUID,
    state: State,
    *,
    tags: list[str] | None = None,
    name: str | None = None,
    parent_task_run_id: UUID | None = None,
) -> FlowRun:
    return prefect.create_flow_run_from_deployment(
        deployment, state=state, tags=tags, name=name, parent_task_run_id=parent_task_run_id
    )


def state_types(prefect: SyncPrefectClient, runs: list[FlowRun]) -> dict[UUID, StateType]:
    """Each run's state type now, read one run at a time."""
    types = {}
    for run in runs:
        state = prefect.read_flow_run(run.id).state
        assert state is not None
        types[run.id] = state.type
    return types


def test_a_failed_sweep_cancels_every_open_trial_of_more_than_a_page(
    prefect: SyncPrefectClient, deployment: UUID
) -> None:
    sweep = new_run(prefect, deployment, Failed())
    tags = [SWEEP_TAG, f"{SWEEP_TAG}:{sweep.id}"]
    running = [new_run(prefect, deployment, Running(), tags=tags) for _ in range(PAGE + 1)]
    ended = [new_run(prefect, deployment, Completed(), tags=tags) for _ in range(2)]
    other_sweep = new_run(prefect, deployment, Running(), tags=[SWEEP_TAG, f"{SWEEP_TAG}:x"])
    assert sweep.state is not None
    assert_more_than_a_page(prefect, running, PAGE)

    cancel_trials(sweep_flow, sweep, sweep.state)

    assert set(state_types(prefect, running).values()) == {StateType.CANCELLING}
    assert set(state_types(prefect, ended).values()) == {StateType.COMPLETED}
    assert state_types(prefect, [other_sweep]) == {other_sweep.id: StateType.RUNNING}


@task
def cycle() -> None:
    """Stands for the task run a subflow run hangs from."""


def test_an_outage_crashes_every_open_subflow_of_more_than_a_page_and_theirs(
    prefect: SyncPrefectClient, deployment: UUID
) -> None:
    parent = new_run(prefect, deployment, Running())
    under_parent = prefect.create_task_run(cycle, flow_run_id=parent.id, dynamic_key="0").id
    open_children = [
        new_run(prefect, deployment, Running(), parent_task_run_id=under_parent)
        for _ in range(PAGE + 1)
    ]
    ended_child = new_run(prefect, deployment, Completed(), parent_task_run_id=under_parent)
    under_child = prefect.create_task_run(cycle, flow_run_id=open_children[0].id, dynamic_key="0")
    grandchild = new_run(prefect, deployment, Running(), parent_task_run_id=under_child.id)
    assert_more_than_a_page(prefect, open_children, PAGE)

    names = crash_open_subflows(prefect, parent.id, "the API went away")

    assert len(names) == PAGE + 2
    crashed = [*open_children, grandchild]
    assert sorted(names) == sorted(run.name for run in crashed)
    assert set(state_types(prefect, crashed).values()) == {StateType.CRASHED}
    assert state_types(prefect, [ended_child, parent]) == {
        ended_child.id: StateType.COMPLETED,
        parent.id: StateType.RUNNING,
    }
    state = prefect.read_flow_run(grandchild.id).state
    assert state is not None and state.message == "the API went away"


def trial_request(sweep_id: UUID, name: str) -> TrialRequest:
    return TrialRequest(
        trial=0,
        rung=0,
        cycles=2,
        deployment="rl/reads",
        parameters={},
        flow_run_name=name,
        sweep_flow_run_id=str(sweep_id),
        concurrency_limit="reads",
        metric="reward_mean",
        first_cycle=0,
        timeout_s=60.0,
    )


def test_a_retried_sweep_finds_its_trials_run_that_ended_last(
    prefect: SyncPrefectClient, deployment: UUID
) -> None:
    sweep_id = uuid4()
    request = trial_request(sweep_id, f"sweep-{uuid4().hex[:6]}-trial-0-rung-0")
    assert ended_trial_run(prefect, request) is None
    tags = [SWEEP_TAG, request.tag]
    first = new_run(prefect, deployment, Failed(), tags=tags, name=request.flow_run_name)
    new_run(prefect, deployment, Running(), tags=tags, name=request.flow_run_name)
    new_run(prefect, deployment, Completed(), tags=[SWEEP_TAG], name=request.flow_run_name)
    found = ended_trial_run(prefect, request)
    assert found is not None and found.id == first.id

    last = new_run(prefect, deployment, Completed(), tags=tags, name=request.flow_run_name)
    found = ended_trial_run(prefect, request)
    assert found is not None and found.id == last.id


def test_the_comparison_is_keyed_by_the_sweeps_flow_run_id(
    prefect: SyncPrefectClient, deployment: UUID
) -> None:
    """Two sweep flow runs of one name: two keys, each a key Prefect takes, so neither
    comparison overwrites the other's."""
    first = new_run(prefect, deployment, Completed())
    second = new_run(prefect, deployment, Completed(), name=first.name)
    assert second.name == first.name
    keys = [comparison_key(run.id) for run in (first, second)]
    assert keys == [f"sweep-{first.id}", f"sweep-{second.id}"]
    for key, run in zip(keys, (first, second), strict=True):
        prefect.create_artifact(
            ArtifactCreate(key=key, type="markdown", data=str(run.id), flow_run_id=run.id)
        )
    for key, run in zip(keys, (first, second), strict=True):
        (artifact,) = prefect.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=[key]))
        )
        assert artifact.data == str(run.id)
