"""The automatic resume's backstop (flows.resume.sweep) on the test harness's Prefect API and
the shared embedded Whitney: a training run that ended Crashed or Failed with no resume-run
decision (its state event lost) gets one, as the trigger would have given it; a run already
decided, one still settling, one of another deployment or one that completed is left alone;
a second sweep decides nothing twice; a crash named as a decided run is decided too (decisions
are keyed by flow run id). The trigger's own path is tests/e2e/test_resume.py."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest
from prefect import get_client
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import (
    ArtifactCollectionFilter,
    ArtifactCollectionFilterKey,
    FlowRunFilter,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, State
from prefect.states import Completed, Crashed, Failed

from flows.resume.continuation import PARENT_TAG, lineage_from_tags
from flows.resume.flow import decision_key
from flows.resume.sweep import resume_sweep
from whitney.local import EmbeddedWhitney

CRASHED = "Flow run infrastructure exited with non-zero status code -9."
OWN_INPUT = "Flow run encountered an exception: ConfigError: cycles: too big"


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
