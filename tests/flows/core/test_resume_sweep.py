"""The automatic resume's backstop (flows.resume.sweep) on the test harness's Prefect API and
the shared embedded Whitney: a training run that ended Crashed or Failed with no resume-run
decision (its state event lost) gets one, as the trigger would have given it; a run already
decided, one still settling, one of another deployment or one that completed is left alone;
a second sweep decides nothing twice; a recent crash behind more than a page of older failures,
or among more than a page of decided ones, is found; a crash named as a decided run is decided
too (decisions are keyed by flow run id). The trigger's own path is
tests/e2e/test_resume.py. The module runs on a Prefect API of its own whose page (when a read
names no limit) is 5 runs, not 200, so that more than a page is a few runs
(tests/flows/flowtest_prefect_pages.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from flowtest_prefect_pages import assert_more_than_a_page, prefect_api_with_page
from prefect import get_client
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.actions import ArtifactCreate
from prefect.client.schemas.filters import (
    ArtifactCollectionFilter,
    ArtifactCollectionFilterKey,
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.states import Completed, Crashed, Failed, Scheduled

from flows.resume.continuation import PARENT_TAG, lineage_from_tags
from flows.resume.flow import decision_key
from flows.resume.sweep import ended_badly, resume_sweep
from whitney.local import EmbeddedWhitney

CRASHED = "Flow run infrastructure exited with non-zero status code -9."
OWN_INPUT = "Flow run encountered an exception: ConfigError: cycles: too big"
PAGE = 5
"""This module's Prefect page when a read names no limit (PREFECT_SERVER_API_DEFAULT_LIMIT)."""


@pytest.fixture(scope="module", autouse=True)
def small_pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The module's Prefect API, whose page is PAGE runs."""
    with prefect_api_with_page(PAGE, tmp_path_factory.mktemp("resume-sweep")):
        yield


@pytest.fixture
def prefect() -> Iterator[SyncPrefectClient]:
    with get_client(sync_client=True) as client:
        yield client


def deployment(prefect: SyncPrefectClient, name: str) -> UUID:
    flow_id = prefect.create_flow_from_name("rl")
    return prefect.create_deployment(flow_id=flow_id, name=name, parameters={})


def ended(
    prefect: SyncPrefectClient,
    deployment_id: UUID,
    state: State,
    api_url: str,
    name: str | None = None,
) -> FlowRun:
    """A flow run of the deployment, a config of 4 cycles on `api_url`, created in `state`
    (ended now, by the API's clock)."""
    return prefect.create_flow_run_from_deployment(
        deployment_id,
        parameters={"config": {"api_url": api_url, "cycles": 4, "seed": 3}},
        state=state,
        name=name,
    )


def continuations(prefect: SyncPrefectClient, parent: FlowRun) -> list[FlowRun]:
    tag = f"{PARENT_TAG}{parent.id}"
    return prefect.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])))


def test_an_ended_run_nobody_decided_about_is_decided_once(
    whitney: EmbeddedWhitney, prefect: SyncPrefectClient
) -> None:
    name = f"rl-sweep-{uuid4().hex[:8]}"
    training = deployment(prefect, name)
    elsewhere = deployment(prefect, f"{name}-other")
    crashed = ended(prefect, training, Crashed(message=CRASHED), whitney.url)
    own_input = ended(prefect, training, Failed(message=OWN_INPUT), whitney.url)
    completed = ended(prefect, training, Completed(), whitney.url)
    other = ended(prefect, elsewhere, Crashed(message=CRASHED), whitney.url)

    settling = resume_sweep(deployments=[name], settle_seconds=3600)
    assert settling == {"swept": 0, "decided": {}}

    swept = resume_sweep(deployments=[name], settle_seconds=0)
    assert swept["swept"] == 2
    decided = swept["decided"]
    assert set(decided) == {str(crashed.id), str(own_input.id)}
    assert decided[str(crashed.id)]["resumed"] is True
    assert decided[str(crashed.id)]["reason"] == "crashed"
    assert decided[str(own_input.id)] == {
        "resumed": False,
        "reason": f"it ended FAILED, not on an infrastructure error: {OWN_INPUT}",
    }
    (continued,) = continuations(prefect, crashed)
    assert str(continued.id) == decided[str(crashed.id)]["flow_run_id"]
    assert continued.deployment_id == training
    assert continued.parameters["config"]["resume_from"] is None  # it saved no checkpoint
    lineage = lineage_from_tags(continued.tags)
    assert lineage is not None and lineage.parent_flow_run == str(crashed.id)
    assert (lineage.after_cycle, lineage.attempt) == (-1, 1)
    assert continuations(prefect, own_input) == []
    assert continuations(prefect, completed) == [] and continuations(prefect, other) == []

    again = resume_sweep(deployments=[name], settle_seconds=0)
    assert again == {"swept": 2, "decided": {}}
    assert len(continuations(prefect, crashed)) == 1


def first_page(prefect: SyncPrefectClient, name: str) -> set[UUID]:
    """The deployment's Crashed or Failed runs a read naming no sort, limit or time returns."""
    runs = prefect.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.CRASHED, StateType.FAILED])
            )
        ),
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])),
    )
    return {run.id for run in runs}


def test_a_recent_crash_behind_more_than_a_page_of_older_failures_is_found(
    whitney: EmbeddedWhitney, prefect: SyncPrefectClient
) -> None:
    """More than a page of the deployment's runs ended before the window opens, then one
    crashes. The API stamps states with its own clock, so the window opens between them (the
    sweep's own opens `within_hours` before its start); and the crash gets an id below theirs,
    so that Prefect's default order (by id, descending) puts it past the first page, as it may
    on any busy server."""
    name = f"rl-sweep-{uuid4().hex[:8]}"
    training = deployment(prefect, name)
    scheduled = ended(prefect, training, Scheduled(), whitney.url)
    while scheduled.id.int >= 1 << 125:  # an id among the lowest eighth
        prefect.delete_flow_run(scheduled.id)
        scheduled = ended(prefect, training, Scheduled(), whitney.url)
    older: list[FlowRun] = []
    while sum(run.id > scheduled.id for run in older) < PAGE:
        state = Failed(message=OWN_INPUT) if len(older) % 2 else Crashed(message=CRASHED)
        older.append(ended(prefect, training, state, whitney.url))
    prefect.set_flow_run_state(scheduled.id, Crashed(message=CRASHED), force=True)
    recent = prefect.read_flow_run(scheduled.id)
    assert older[-1].end_time is not None and recent.end_time is not None
    assert older[-1].end_time < recent.end_time
    assert recent.id not in first_page(prefect, name)

    opened = older[-1].end_time + (recent.end_time - older[-1].end_time) / 2
    found = ended_badly(prefect, (name,), opened, datetime.now(UTC))
    assert [run.id for run in found] == [recent.id]
    everything = ended_badly(prefect, (name,), older[0].end_time, datetime.now(UTC))
    assert {run.id for run in everything} == {run.id for run in [*older, recent]}


def test_crashes_among_more_than_a_page_of_decided_ones_are_each_decided_once(
    whitney: EmbeddedWhitney, prefect: SyncPrefectClient
) -> None:
    """More than a page of crashes in the window already have their decision record (the
    trigger's); the one without is decided, none of the others again."""
    name = f"rl-sweep-{uuid4().hex[:8]}"
    training = deployment(prefect, name)
    decided = [
        ended(prefect, training, Crashed(message=CRASHED), whitney.url) for _ in range(PAGE + 1)
    ]
    for run in decided:
        record = ArtifactCreate(key=decision_key(run.id), type="markdown", data="decided")
        prefect.create_artifact(record)
    fresh = ended(prefect, training, Crashed(message=CRASHED), whitney.url)
    assert_more_than_a_page(prefect, decided, PAGE)

    swept = resume_sweep(deployments=[name], settle_seconds=0)
    assert swept["swept"] == PAGE + 2
    assert set(swept["decided"]) == {str(fresh.id)}
    assert swept["decided"][str(fresh.id)]["resumed"] is True
    assert len(continuations(prefect, fresh)) == 1


def test_a_crash_named_as_a_decided_run_is_decided_too(
    whitney: EmbeddedWhitney, prefect: SyncPrefectClient
) -> None:
    """Flow run names repeat (random slugs, trial names): a decision is keyed by the run's id,
    so a new crash sharing a decided run's name is resumed and both records stay."""
    name = f"rl-sweep-{uuid4().hex[:8]}"
    training = deployment(prefect, name)
    first = ended(prefect, training, Crashed(message=CRASHED), whitney.url)
    resume_sweep(deployments=[name], settle_seconds=0)
    assert len(continuations(prefect, first)) == 1

    second = ended(prefect, training, Crashed(message=CRASHED), whitney.url, name=first.name)
    assert second.name == first.name and second.id != first.id
    swept = resume_sweep(deployments=[name], settle_seconds=0)
    assert len(continuations(prefect, second)) == 1
    assert swept["swept"] == 2
    assert set(swept["decided"]) == {str(second.id)}
    assert swept["decided"][str(second.id)]["resumed"] is True

    records = prefect.read_latest_artifacts(
        artifact_filter=ArtifactCollectionFilter(
            key=ArtifactCollectionFilterKey(any_=[decision_key(first.id), decision_key(second.id)])
        )
    )
    assert len(records) == 2
    for run in (first, second):
        (continued,) = continuations(prefect, run)
        (record,) = [r for r in records if r.key == decision_key(run.id)]
        assert f"Resumed as flow run {continued.name} ({continued.id})" in str(record.data)
