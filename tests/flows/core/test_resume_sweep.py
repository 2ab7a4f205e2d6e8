"""The automatic resume's backstop (flows.resume.sweep) on the test harness's Prefect API and
the shared embedded Whitney: a training run that ended Crashed or Failed with no resume-run
decision (its state event lost) gets one, as the trigger would have given it; a run already
decided, one still settling, one of another deployment or one that completed is left alone;
a second sweep decides nothing twice. The trigger's own path is tests/e2e/test_resume.py."""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID, uuid4

import pytest
from prefect import get_client
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun
from prefect.states import Completed, Crashed, Failed

from flows.resume.continuation import PARENT_TAG, lineage_from_tags
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


def ended(prefect: SyncPrefectClient, deployment_id: UUID, state, api_url: str) -> FlowRun:
    """A flow run of the deployment, a config of 4 cycles on `api_url`, forced into `state`."""
    run = prefect.create_flow_run_from_deployment(
        deployment_id, parameters={"config": {"api_url": api_url, "cycles": 4, "seed": 3}}
    )
    prefect.set_flow_run_state(run.id, state, force=True)
    return prefect.read_flow_run(run.id)


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
    assert set(decided) == {crashed.name, own_input.name}
    assert decided[crashed.name]["resumed"] is True
    assert decided[crashed.name]["reason"] == "crashed"
    assert decided[own_input.name] == {
        "resumed": False,
        "reason": f"it ended FAILED, not on an infrastructure error: {OWN_INPUT}",
    }
    (continued,) = continuations(prefect, crashed)
    assert str(continued.id) == decided[crashed.name]["flow_run_id"]
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
