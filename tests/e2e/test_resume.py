"""Runs that heal themselves, on the real Prefect server and process worker: the resume-run
trigger (deployments/prefect.yaml) continues a deployed RL run whose process was SIGKILLed
from its latest checkpoint, with the adapter of an undisturbed run; leaves a run that failed
on its own input alone; gives up on a run that crashes again at the same cycle after its
bound, with the reason; a run rides through the Prefect server SIGKILLed mid-cycle and
started again, saying so once; a run whose worker is SIGKILLed crashes on its broken output
pipe and is resumed (or, without streamed output, goes on); and a run under the whole stack
SIGKILLed and started again is marked Crashed by the heartbeat automation and resumed.

The faults come from the flow run's environment (the job variables of its run, which a
resumed run inherits): `e2e_faults.FaultsFromEnv`. Every run uses the config of
test_deployments' SMALL on that environment, so every completed one ends with one sha256.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import LOG_DIR, PREFECT_SERVER, RESUME_TRIGGER, WHITNEY_SERVER, WORKER, Stack
from .harness import REPO_ROOT, executable, pid_alive, run_command, wait_for
from .test_deployments import (
    SMALL,
    adapter_sha256,
    executions,
    finished_run,
    trigger,
    wait_run,
    whitney_runs,
)

FAULTS_ENV = "e2e_faults:FaultsFromEnv"
RESUME_DEPLOYMENT = ("resume-run", "resume-run")
CHAIN_TIMEOUT_S = 240
"""A crash, the worker starting resume-run, resume-run starting the continued run."""
CRASH_CYCLE = 2
CONFIG: dict[str, Any] = {**SMALL, "env": FAULTS_ENV, "checkpoint_every": 1}
"""Checkpoints after cycles 0 and 1: a run killed at cycle 2 resumes after cycle 1."""

OUTAGE_S = float(os.environ.get("E2E_PREFECT_OUTAGE_S") or 0)
"""The least time the Prefect server stays down in the outage test (0: as short as it can)."""

pytestmark = pytest.mark.timeout(900)


def start(
    stack: Stack,
    config: dict[str, Any],
    env: dict[str, str],
    message: str,
    job_variables: dict[str, Any] | None = None,
) -> str:
    """A run of rl-on-demand with `config` and these environment variables for its process
    (the Custom run form's job variables, with `job_variables`); its flow run id."""
    deployment = stack.deployment()
    flow_run = stack.api.post(
        f"/deployments/{deployment['id']}/create_flow_run",
        json={
            "parameters": {"config": config, "whitney_block": "whitney"},
            "job_variables": {**(job_variables or {}), "env": env},
            "state": {"type": "SCHEDULED", "message": message},
        },
    )
    return flow_run["id"]


def resume_deployment_id(stack: Stack) -> str:
    return stack.api.deployment(*RESUME_DEPLOYMENT)["id"]


def resume_run_of(stack: Stack, flow_run_id: str) -> dict[str, Any]:
    """The resume-run flow run the trigger started for `flow_run_id`, once COMPLETED."""
    deployment_id = resume_deployment_id(stack)

    def started() -> dict[str, Any] | None:
        runs = stack.api.post(
            "/flow_runs/filter",
            json={"flow_runs": {"deployment_id": {"any_": [deployment_id]}}, "limit": 200},
        )
        wanted = f"prefect.flow-run.{flow_run_id}"
        mine = [run for run in runs if run["parameters"].get("flow_run_id") == wanted]
        assert len(mine) <= 1, mine
        return mine[0] if mine else None

    run = wait_for(
        f"resume-run for {flow_run_id}", started, CHAIN_TIMEOUT_S, evidence=stack.evidence
    )
    return stack.api.wait_flow_run(run["id"], ["COMPLETED"], CHAIN_TIMEOUT_S, stack.evidence)


def continued_by(stack: Stack, flow_run_id: str) -> list[dict[str, Any]]:
    """The flow runs tagged as continuing `flow_run_id`."""
    tag = f"whitney.parent-flow-run:{flow_run_id}"
    return stack.api.post(
        "/flow_runs/filter", json={"flow_runs": {"tags": {"all_": [tag]}}, "limit": 10}
    )


def events_named(stack: Stack, flow_run_id: str, name: str) -> list[dict[str, Any]]:
    """The `name` events about the flow run, once there is one (the server writes them in
    batches)."""

    def found() -> list[dict[str, Any]] | None:
        events = stack.api.events([f"prefect.flow-run.{flow_run_id}"])
        named = [event for event in events if event["event"] == name]
        return named or None

    return wait_for(f"{name} about {flow_run_id}", found, 30)


@pytest.fixture(scope="module")
def healing(stack: Stack) -> Any:
    """The stack with the resume-run trigger on (off for the other e2e modules)."""
    stack.enable_automation(RESUME_TRIGGER, True)
    yield stack
    stack.enable_automation(RESUME_TRIGGER, False)


class Reference:
    """An undisturbed run of CONFIG (no fault in its environment), started once a session by
    the `reference` fixture (tests/e2e/conftest.py) and training beside the tests that compare
    with it; the sha256 of its adapter, read once it completed."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.flow_run_id = start(stack, CONFIG, {}, "e2e: undisturbed reference")
        self._sha256: str | None = None

    def sha256(self) -> str:
        if self._sha256 is None:
            wait_run(self.stack, self.flow_run_id, ["COMPLETED"])
            run = finished_run(self.stack, self.flow_run_id)
            self._sha256 = adapter_sha256(self.stack, run.run_id)
        return self._sha256


def test_a_sigkilled_run_is_resumed_from_its_checkpoint_with_the_undisturbed_adapter(
    healing: Stack, reference: Reference
) -> None:
    token = uuid.uuid4().hex
    env = {"E2E_CRASH_AT_CYCLE": str(CRASH_CYCLE), "E2E_CRASH_TOKEN": token}
    crashed_id = start(healing, CONFIG, env, "e2e: SIGKILLed at cycle 2")
    crashed = healing.api.wait_flow_run(crashed_id, ["CRASHED"], CHAIN_TIMEOUT_S, healing.evidence)
    assert (Path(healing.env["E2E_FAULT_DIR"]) / f"crashed-{token}").exists()
    assert "-9" in (crashed["state"]["message"] or ""), crashed["state"]

    decision = resume_run_of(healing, crashed_id)
    assert decision["parameters"]["flow_run_id"] == f"prefect.flow-run.{crashed_id}"
    (continued,) = wait_for(
        "the continued run", lambda: continued_by(healing, crashed_id) or None, 30
    )
    done = wait_run(healing, continued["id"], ["COMPLETED"])

    # the lineage: tags, the resume_from parameter, the event
    assert {
        f"whitney.parent-flow-run:{crashed_id}",
        "whitney.after-cycle:1",
        "whitney.reason:crashed",
        "whitney.resume-attempt:1",
    } <= set(done["tags"])
    (killed_run,) = whitney_runs(healing, crashed_id)
    checkpoint = f"whitney://runs/{killed_run.run_id}/states/cycle-1"
    assert done["parameters"]["config"] == {**CONFIG, "resume_from": checkpoint}
    (event,) = events_named(healing, crashed_id, "whitney.run.resumed")
    assert event["payload"] == {
        "parent_flow_run": crashed_id,
        "after_cycle": 1,
        "reason": "crashed",
        "attempt": 1,
        "checkpoint": checkpoint,
        "flow_run_id": continued["id"],
    }

    # the same computation: cycle 2 on a run created from the checkpoint, each seq id once
    run = finished_run(healing, continued["id"])
    assert run.model_extra["from_checkpoint"] == checkpoint
    assert set(executions(healing, run.run_id).values()) == {1}
    assert set(executions(healing, killed_run.run_id).values()) == {1}
    assert adapter_sha256(healing, run.run_id) == reference.sha256()
    cycles = healing.api.child_flow_runs(done["id"])
    assert [(c["name"], c["state_type"]) for c in cycles] == [("cycle-2", "COMPLETED")]


def test_a_run_that_failed_on_its_own_input_is_not_resumed(healing: Stack) -> None:
    failed = trigger(healing, dict(SMALL), "e2e: no such block", block="no-such-block")
    wait_run(healing, failed["id"], ["FAILED"])
    decision = resume_run_of(healing, failed["id"])
    (event,) = events_named(healing, failed["id"], "whitney.run.not-resumed")
    reason = event["payload"]["reason"]
    assert reason.startswith("it ended FAILED, not on an infrastructure error"), reason
    assert "no WhitneyCredentials block named 'no-such-block'" in reason
    assert continued_by(healing, failed["id"]) == []
    artifacts = healing.api.artifacts([decision["id"]])
    assert any("Not resumed: it ended FAILED" in (a["data"] or "") for a in artifacts)


def test_a_run_that_crashes_again_at_the_same_cycle_stops_after_the_bound(
    healing: Stack,
) -> None:
    deployment_id = resume_deployment_id(healing)
    bound = 1  # the deployment's is 3; each link of the chain costs 30-60 s here
    healing.api._call(
        "PATCH",
        f"/deployments/{deployment_id}",
        json={"parameters": {"whitney_block": "whitney", "max_attempts": bound}},
    )
    try:
        current = start(
            healing, CONFIG, {"E2E_CRASH_AT_CYCLE": str(CRASH_CYCLE)}, "e2e: always crashes"
        )
        chain = [current]
        for attempt in range(1, bound + 1):
            healing.api.wait_flow_run(current, ["CRASHED"], CHAIN_TIMEOUT_S, healing.evidence)
            resume_run_of(healing, current)
            (continued,) = continued_by(healing, current)
            assert f"whitney.resume-attempt:{attempt}" in continued["tags"]
            assert "whitney.after-cycle:1" in continued["tags"]
            current = continued["id"]
            chain.append(current)
        healing.api.wait_flow_run(current, ["CRASHED"], CHAIN_TIMEOUT_S, healing.evidence)
        resume_run_of(healing, current)
        assert continued_by(healing, current) == []
        (event,) = events_named(healing, current, "whitney.run.not-resumed")
        reason = event["payload"]["reason"]
        assert reason.startswith(f"gave up after {bound} runs in a row stopped after cycle 1")
        assert "crashed" in reason
        # every run of the chain left nothing open on Whitney
        for flow_run_id in chain:
            assert all(run.status != "running" for run in whitney_runs(healing, flow_run_id))
    finally:
        healing.api._call(
            "PATCH",
            f"/deployments/{deployment_id}",
            json={"parameters": {"whitney_block": "whitney", "max_attempts": 3}},
        )


def test_a_run_rides_through_the_prefect_server_killed_mid_cycle_and_restarted(
    healing: Stack, reference: Reference
) -> None:
    """The server dies while cycle 1 is held; the cycle finishes meanwhile and cannot record
    itself; the flow says Prefect is away, waits for it, and makes the cycle again once the
    server is back (it replays from the journal).

    By default PREFECT_CLIENT_MAX_RETRIES=1 for this flow run keeps the test short (Prefect's
    own retries give up after 2 s instead of ~62 s) and the server is started again as soon as
    the flow has said Prefect is away. E2E_PREFECT_OUTAGE_S=60 keeps it down at least 60 s
    (from the SIGKILL until it is started again) with Prefect's default client settings:
    the figure of docs/reliability.md."""
    token = uuid.uuid4().hex
    faults = Path(healing.env["E2E_FAULT_DIR"])
    env = {"E2E_HOLD_AT_CYCLE": "1", "E2E_HOLD_TOKEN": token}
    if not OUTAGE_S:
        env["PREFECT_CLIENT_MAX_RETRIES"] = "1"
    flow_run_id = start(healing, {**SMALL, "env": FAULTS_ENV}, env, "e2e: Prefect killed")
    wait_for(
        "cycle 1 to be held",
        lambda: (faults / f"held-{token}").exists(),
        CHAIN_TIMEOUT_S,
        evidence=healing.evidence,
    )
    worker = healing.process(WORKER)
    mark = len(worker.log_text())
    healing.kill(PREFECT_SERVER)
    killed_at = time.monotonic()
    (faults / f"release-{token}").touch()
    if OUTAGE_S:  # the outage's length is the fault itself, not a synchronisation
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - killed_at)))
    else:
        wait_for(
            "the flow to say that Prefect is away",
            lambda: "Prefect is away" in worker.log_text()[mark:],
            120,
            evidence=healing.evidence,
        )
    healing.restart(PREFECT_SERVER)
    outage_s = time.monotonic() - killed_at

    done = wait_run(healing, flow_run_id, ["COMPLETED"])
    assert done["run_count"] == 1
    run = finished_run(healing, flow_run_id)
    assert set(executions(healing, run.run_id).values()) == {1}, "a seq id ran twice"
    assert adapter_sha256(healing, run.run_id) == reference.sha256()

    output = worker.log_text()[mark:]
    said = output.count("Prefect is away")
    assert said == 1, output[-4000:]
    assert output.count("Prefect is back after") == 1, output[-4000:]
    raw = [
        line
        for line in output.splitlines()
        if "failed to process" in line and ("prefect.task-run" in line or "whitney." in line)
    ]
    assert raw == [], raw[:3]
    assert "' - Encountered exception during execution: ConnectError" not in output  # traceback
    children = healing.api.child_flow_runs(flow_run_id)
    cycles = [c["name"] for c in children]
    assert cycles[0] == "cycle-0" and cycles[-2:] == ["cycle-1", "cycle-2"], cycles
    # the cycle the outage interrupted, if its run was recorded, is Crashed, not left Running
    assert {c["state_type"] for c in children} <= {"COMPLETED", "CRASHED"}, children
    print(json.dumps({"outage_s": round(outage_s, 1), "said_away": said, "cycle_runs": cycles}))
    healing.process(PREFECT_SERVER).check_running()


def flow_process(stack: Stack, flow_run_id: str) -> int:
    """The PID of the flow run's process, as the worker recorded it (`host:pid`)."""
    run = wait_for(
        f"the process of flow run {flow_run_id}",
        lambda: stack.api.flow_run(flow_run_id).get("infrastructure_pid") or None,
        60,
    )
    return int(str(run).rsplit(":", 1)[-1])


@pytest.mark.parametrize("stream_output", [True, False], ids=["output-to-worker", "no-output"])
def test_the_worker_killed_mid_run(
    healing: Stack, reference: Reference, stream_output: bool
) -> None:
    """Prefect 3.9's process worker starts each flow run in a session of its own
    (`WorkspaceResolvingEngineCommandStarter`, `isolate_process_group`): a SIGKILL of the
    worker's process group leaves the run's process alive. With the pool's default
    `stream_output` (its output piped to the worker), the run's next console line meets a
    broken pipe, rich raises SystemExit(1), the engine reports the run Crashed itself and its
    hooks release its session: the automatic resume continues it from its latest checkpoint.
    With `stream_output: false` nothing breaks: the run goes on and completes. Either way it
    ends with the adapter of an undisturbed run."""
    token = uuid.uuid4().hex
    faults = Path(healing.env["E2E_FAULT_DIR"])
    env = {"E2E_HOLD_AT_CYCLE": str(CRASH_CYCLE), "E2E_HOLD_TOKEN": token}
    flow_run_id = start(
        healing, CONFIG, env, "e2e: worker killed", job_variables={"stream_output": stream_output}
    )
    wait_for(
        f"cycle {CRASH_CYCLE} to be held",
        lambda: (faults / f"held-{token}").exists(),
        CHAIN_TIMEOUT_S,
        evidence=healing.evidence,
    )
    pid = flow_process(healing, flow_run_id)
    healing.process(WORKER).remember_descendants()
    assert pid in healing.process(WORKER).descendants
    killed_at = time.monotonic()
    healing.kill(WORKER)
    assert pid_alive(pid), "the flow run's process died with its worker"
    restart_s = healing.restart(WORKER)
    (faults / f"release-{token}").touch()

    if stream_output:
        crashed = healing.api.wait_flow_run(
            flow_run_id, ["CRASHED"], CHAIN_TIMEOUT_S, healing.evidence
        )
        assert "system exit" in (crashed["state"]["message"] or ""), crashed["state"]
        resume_run_of(healing, flow_run_id)
        (continued,) = continued_by(healing, flow_run_id)
        done = wait_run(healing, continued["id"], ["COMPLETED"])
        assert "whitney.reason:crashed" in done["tags"]
        (killed_run,) = whitney_runs(healing, flow_run_id)
        assert set(executions(healing, killed_run.run_id).values()) == {1}
        assert killed_run.status != "running"
        cycles = healing.api.child_flow_runs(flow_run_id)
        assert all(cycle["state_type"] in ("COMPLETED", "CRASHED") for cycle in cycles), cycles
    else:
        done = wait_run(healing, flow_run_id, ["COMPLETED"])
        assert done["run_count"] == 1
        assert continued_by(healing, flow_run_id) == []
    run = finished_run(healing, done["id"])
    assert set(executions(healing, run.run_id).values()) == {1}, "a seq id ran twice"
    assert adapter_sha256(healing, run.run_id) == reference.sha256()
    wait_for("the killed worker's flow process to exit", lambda: not pid_alive(pid), 60)
    print(
        json.dumps(
            {
                "stream_output": stream_output,
                "worker_restart_s": round(restart_s, 1),
                "completed_after_s": round(time.monotonic() - killed_at, 1),
            }
        )
    )


SILENT_AFTER_S = 60
"""The crash automation's `within` in the whole-stack test (deployments/automations.yaml
says 600): with heartbeats every HEARTBEAT_S, two missed ones."""
HEARTBEAT_S = 30
"""PREFECT_FLOWS_HEARTBEAT_FREQUENCY of the whole-stack test's run (Prefect's least)."""


@pytest.fixture
def crash_automation(healing: Stack, tmp_path: Path) -> Any:
    """Step 6 of docs/prefect-server.md, the automation that marks a silent flow run Crashed,
    with `within` SILENT_AFTER_S; deleted afterwards (other modules' runs beat every 180 s)."""
    spec = yaml.safe_load((REPO_ROOT / "deployments" / "automations.yaml").read_text())
    (automation,) = spec["automations"]
    automation["trigger"]["within"] = SILENT_AFTER_S
    path = tmp_path / "automations.yaml"
    path.write_text(yaml.safe_dump(spec))
    run_command(
        [executable("prefect"), "automation", "create", "--from-file", str(path)],
        healing.env,
        timeout=120,
        log_dir=LOG_DIR,
        name="automation-create",
    )
    yield automation["name"]
    for found in healing.api.post(
        "/automations/filter", json={"automations": {"name": {"any_": [automation["name"]]}}}
    ):
        healing.api._call("DELETE", f"/automations/{found['id']}")


def test_the_whole_stack_killed_mid_run_and_started_again_resumes_the_run(
    healing: Stack, reference: Reference, crash_automation: str
) -> None:
    """Prefect server, Whitney server, worker and the flow run's process SIGKILLed while cycle
    2 is held, then started again with the same commands, ports and data. Nobody is left to
    report the run: the crash automation marks it Crashed once its heartbeats have stopped for
    SILENT_AFTER_S, and the resume-run trigger continues it after cycle 1."""
    token = uuid.uuid4().hex
    faults = Path(healing.env["E2E_FAULT_DIR"])
    env = {
        "E2E_HOLD_AT_CYCLE": str(CRASH_CYCLE),
        "E2E_HOLD_TOKEN": token,
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
    }
    killed_id = start(healing, CONFIG, env, "e2e: the whole stack killed")
    wait_for(
        f"cycle {CRASH_CYCLE} to be held",
        lambda: (faults / f"held-{token}").exists(),
        CHAIN_TIMEOUT_S,
        evidence=healing.evidence,
    )
    events_named(healing, killed_id, "prefect.flow-run.heartbeat")
    pid = flow_process(healing, killed_id)
    killed_at = time.monotonic()
    for name in (WORKER, WHITNEY_SERVER, PREFECT_SERVER):
        healing.kill(name)
    for orphan in healing.orphans:  # the flow run's process, left by its worker
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
    wait_for("the flow run's process to die", lambda: not pid_alive(pid), 30)
    restarts = {name: healing.restart(name) for name in (PREFECT_SERVER, WHITNEY_SERVER, WORKER)}

    crashed = healing.api.wait_flow_run(
        killed_id, ["CRASHED"], SILENT_AFTER_S + CHAIN_TIMEOUT_S, healing.evidence
    )
    crashed_after_s = time.monotonic() - killed_at
    assert "No heartbeat" in (crashed["state"]["message"] or ""), crashed["state"]
    resume_run_of(healing, killed_id)
    (continued,) = continued_by(healing, killed_id)
    done = wait_run(healing, continued["id"], ["COMPLETED"])
    assert {"whitney.after-cycle:1", "whitney.reason:crashed"} <= set(done["tags"])
    run = finished_run(healing, continued["id"])
    assert set(executions(healing, run.run_id).values()) == {1}, "a seq id ran twice"
    (killed_run,) = whitney_runs(healing, killed_id)
    assert set(executions(healing, killed_run.run_id).values()) == {1}, "a seq id ran twice"
    assert killed_run.status != "running"
    assert adapter_sha256(healing, run.run_id) == reference.sha256()
    print(
        json.dumps(
            {
                "restart_s": {name: round(seconds, 1) for name, seconds in restarts.items()},
                "crashed_after_s": round(crashed_after_s, 1),
                "completed_after_s": round(time.monotonic() - killed_at, 1),
            }
        )
    )
