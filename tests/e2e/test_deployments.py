"""Deployed RL runs on a real Prefect server and process worker, triggered, cancelled and
retried through the API calls the Prefect UI makes, checked through the Prefect API and on
the Whitney server.

Every run here uses the same small training config (`SMALL`), so all runs that complete must
end with the same adapter (sha256): the undisturbed reference run, the run whose cycle 1
failed once and was retried by Prefect, and the failed run retried from the UI.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
import uuid
from typing import Any

import pytest

from flows.rl.config import RLConfig

from .conftest import BLOCK_NAME, WORK_POOL, Stack
from .harness import HarnessError, wait_for

SMALL: dict[str, Any] = {
    "cycles": 3,
    "seed": 7,
    "prompts_per_cycle": 3,
    "group_size": 4,
    "max_tokens": 8,
}
"""Non-default parameters: fewer and smaller cycles than the flow's defaults."""


def cycle_ops(index: int, count: int, first: int = 0, checkpoint_every: int = 0) -> list[str]:
    """A pipelined cycle's operations, in seq order (SMALL: 3 prompts): the attempt's first
    cycle publishes its own sampler; a checkpoint, when one is due (after every
    `checkpoint_every` cycles, but not the last), follows optim_step; every cycle but the last
    publishes the next one's sampler."""
    own = ["save_weights_for_sampler"] if index == first else []
    due = checkpoint_every > 0 and (index + 1) % checkpoint_every == 0 and index < count - 1
    checkpoint = ["save_state"] if due else []
    publish_next = ["save_weights_for_sampler"] if index < count - 1 else []
    return own + ["sample"] * 3 + ["forward_backward", "optim_step"] + checkpoint + publish_next


TASK_RUN_NAME = re.compile(r"^(?P<kind>[a-z_]+)\[seq=(?P<seq>\d+)\]$")
FAULT_ENV = "e2e_faults:FailOnceAtCycle1"
RUN_TIMEOUT_S = 150
FLOW_RUN_LABEL = "prefect.flow-run-id"

pytestmark = pytest.mark.timeout(420)


def trigger(
    stack: Stack, config: dict[str, Any], message: str, block: str = BLOCK_NAME
) -> dict[str, Any]:
    """A run of rl-on-demand with `config`, as the UI's custom run form submits it."""
    deployment = stack.deployment()
    parameters = {"config": config, "whitney_block": block}
    return stack.api.create_flow_run_from_deployment(deployment["id"], parameters, message)


def wait_run(stack: Stack, flow_run_id: str, states: list[str]) -> dict[str, Any]:
    return stack.api.wait_flow_run(flow_run_id, states, RUN_TIMEOUT_S, evidence=stack.evidence)


def cycle_runs(stack: Stack, flow_run_id: str) -> list[dict[str, Any]]:
    runs = stack.api.child_flow_runs(flow_run_id)
    return sorted(runs, key=lambda run: int(run["name"].rsplit("-", 1)[1]))


def sessions_of(stack: Stack, flow_run_id: str) -> list[Any]:
    with stack.whitney_client() as client:
        return client.list_sessions(label=f"{FLOW_RUN_LABEL}:{flow_run_id}")


def whitney_runs(stack: Stack, flow_run_id: str) -> list[Any]:
    """The Whitney runs of every session the flow run opened."""
    with stack.whitney_client() as client:
        runs = []
        for session in client.list_sessions(label=f"{FLOW_RUN_LABEL}:{flow_run_id}"):
            for run_id in client.get_session(session.session_id).run_ids or []:
                runs.append(client.get_run(run_id))
        return runs


def journal(stack: Stack, run_id: str) -> list[Any]:
    with stack.whitney_client() as client:
        return client.journal(run_id, limit=1000)


def executions(stack: Stack, run_id: str) -> dict[int, int]:
    """How often the server executed each seq id of the run (its journal, read-only)."""
    path = stack.whitney_data / "journal.sqlite3"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        rows = db.execute(
            "SELECT seq_id, executions FROM operations WHERE run_id = ?", (run_id,)
        ).fetchall()
    return dict(rows)


def adapter_sha256(stack: Stack, run_id: str) -> str:
    exports = [op for op in journal(stack, run_id) if op.kind == "export_lora"]
    assert len(exports) == 1, exports
    assert exports[0].status == "succeeded"
    return exports[0].result["sha256"]


def finished_run(stack: Stack, flow_run_id: str) -> Any:
    """The one Whitney run of a completed flow run attempt that finished."""
    finished = [run for run in whitney_runs(stack, flow_run_id) if run.status == "finished"]
    assert len(finished) == 1, whitney_runs(stack, flow_run_id)
    return finished[0]


def assert_nothing_open(stack: Stack, flow_run_id: str, timeout: float = 60) -> list[Any]:
    """Wait (bounded) until every session of the flow run is closed and every run terminal;
    the sessions."""

    def released() -> list[Any] | None:
        sessions = sessions_of(stack, flow_run_id)
        runs = whitney_runs(stack, flow_run_id)
        closed = bool(sessions) and all(session.status == "closed" for session in sessions)
        if closed and all(run.status in ("finished", "cancelled", "failed") for run in runs):
            return sessions
        return None

    return wait_for(
        f"the Whitney sessions of flow run {flow_run_id} to be released",
        released,
        timeout,
        interval=0.5,
        evidence=lambda: f"sessions: {sessions_of(stack, flow_run_id)}\n{stack.evidence()}",
    )


def task_run_names(stack: Stack, flow_run_id: str, wanted: set[str]) -> list[str]:
    """The names of the flow run's task runs, once every `wanted` one is recorded: the Prefect
    server writes task runs in batches, up to a second after their events
    (flows/core/orchestration/prefect_env.py), so a flow run can be COMPLETED before its last task
    runs are."""

    def recorded() -> list[str] | None:
        names = [run["name"] for run in stack.api.task_runs([flow_run_id])]
        return names if wanted <= set(names) else None

    return wait_for(
        f"the task runs {sorted(wanted)} of flow run {flow_run_id}",
        recorded,
        30,
        evidence=lambda: f"task runs: {stack.api.task_runs([flow_run_id])}",
    )


def check_task_runs(
    stack: Stack,
    cycles: list[dict[str, Any]],
    cycle_count: int,
    first: int = 0,
    checkpoint_every: int = 0,
) -> None:
    """The cycle subflows of one attempt, from cycle `first`: each one's task runs are
    `{kind}[seq=N]`, in the cycle's block of seq ids, which follow each other from 1."""
    seq = 1
    for index, cycle in enumerate(cycles, start=first):
        expected = cycle_ops(index, cycle_count, first, checkpoint_every)
        wanted = {f"{kind}[seq={seq + offset}]" for offset, kind in enumerate(expected)}
        names = task_run_names(stack, cycle["id"], wanted)
        parsed = sorted(
            (int(match["seq"]), match["kind"])
            for match in map(TASK_RUN_NAME.match, names)
            if match is not None
        )
        assert len(parsed) == len(names), names
        # a retried cycle re-creates its task runs: one name per (seq, kind) and attempt
        unique = sorted(set(parsed))
        assert [kind for _, kind in unique] == expected, (cycle["name"], names)
        assert [seq_id for seq_id, _ in unique] == list(range(seq, seq + len(expected)))
        seq += len(expected)
        assert cycle["name"] == f"cycle-{index}"
    assert len(cycles) == cycle_count - first


@pytest.fixture(scope="module")
def reference(stack: Stack) -> dict[str, Any]:
    """The undisturbed run of SMALL, triggered as the UI triggers it; waited to COMPLETED."""
    started = time.monotonic()
    flow_run = trigger(stack, dict(SMALL), "e2e: reference run")
    done = wait_run(stack, flow_run["id"], ["COMPLETED"])
    run = finished_run(stack, done["id"])
    return {
        "flow_run": done,
        "whitney_run": run,
        "sha256": adapter_sha256(stack, run.run_id),
        "seconds": time.monotonic() - started,
    }


def test_the_deployment_form_is_typed(alive: Stack) -> None:
    deployment = alive.deployment()
    assert deployment["work_pool_name"] == WORK_POOL
    assert deployment["entrypoint"] == "flows/rl/flow.py:rl_flow"
    assert deployment["parameters"] == {"whitney_block": BLOCK_NAME}
    assert deployment["enforce_parameter_schema"] is True
    schema = deployment["parameter_openapi_schema"]
    assert set(schema["properties"]) >= {"config", "whitney_block"}
    definitions = schema.get("definitions") or schema.get("$defs")
    rl_config = definitions["RLConfig"]
    defaults = RLConfig()
    cycles = rl_config["properties"]["cycles"]
    assert cycles["default"] == defaults.cycles and cycles["minimum"] == 1
    assert cycles["description"] == RLConfig.model_fields["cycles"].description
    assert rl_config["properties"]["loss"]["default"] == defaults.loss
    assert set(rl_config["properties"]) == set(RLConfig.model_fields)
    assert "enum" in json.dumps(rl_config["properties"]["provider"])
    undocumented = [
        name for name, prop in rl_config["properties"].items() if not prop.get("description")
    ]
    assert not undocumented, f"config fields with no description in the UI form: {undocumented}"


def test_the_sft_nightly_deployment_is_scheduled_and_typed(alive: Stack) -> None:
    from flows.sft.config import SFTConfig

    deployment = alive.api.deployment("sft", "sft-nightly")
    assert deployment["work_pool_name"] == WORK_POOL
    assert deployment["entrypoint"] == "flows/sft/flow.py:sft_flow"
    assert deployment["parameters"] == {"whitney_block": BLOCK_NAME}
    assert deployment["enforce_parameter_schema"] is True
    (schedule,) = deployment["schedules"]
    assert schedule["active"] is True
    assert schedule["schedule"]["cron"] == "0 2 * * *"
    schema = deployment["parameter_openapi_schema"]
    assert set(schema["properties"]) >= {"config", "whitney_block"}
    sft_config = (schema.get("definitions") or schema.get("$defs"))["SFTConfig"]
    assert set(sft_config["properties"]) == set(SFTConfig.model_fields) - {"cycles"}
    steps = sft_config["properties"]["steps"]
    assert steps["default"] == SFTConfig().steps and steps["minimum"] == 1
    assert sft_config["properties"]["schedule"]["enum"] == ["constant", "linear", "cosine"]
    undocumented = [
        name for name, prop in sft_config["properties"].items() if not prop.get("description")
    ]
    assert not undocumented, f"config fields with no description in the UI form: {undocumented}"


def test_the_reaper_deployment_runs_every_15_minutes_and_closes_orphans(alive: Stack) -> None:
    deployment = alive.api.deployment("reap", "reap-every-15-minutes")
    assert deployment["entrypoint"] == "flows/reap/flow.py:reap_orphaned_sessions"
    assert deployment["parameters"] == {"whitney_block": BLOCK_NAME, "apply": True}
    (schedule,) = deployment["schedules"]
    assert (schedule["active"], schedule["schedule"]["interval"]) == (True, 900)
    with alive.whitney_client() as client:
        gone = client.open_session(labels={FLOW_RUN_LABEL: str(uuid.uuid4())})
        unlabelled = client.open_session()
    flow_run = alive.api.create_flow_run_from_deployment(deployment["id"], {}, "e2e: reap")
    wait_run(alive, flow_run["id"], ["COMPLETED"])
    with alive.whitney_client() as client:
        assert client.get_session(gone.session_id).status == "closed"
        assert client.get_session(unlabelled.session_id).status == "open"
        client.close_session(unlabelled.session_id)


def test_the_block_never_shows_its_key(alive: Stack) -> None:
    documents = alive.api.post(
        "/block_documents/filter",
        json={"block_types": {"slug": {"any_": ["whitney-credentials"]}}},
    )
    assert [document["name"] for document in documents] == [BLOCK_NAME]
    document = alive.api.get(f"/block_documents/{documents[0]['id']}")
    assert document["data"]["base_url"] == alive.whitney_url
    assert document["data"]["api_key"] != alive.whitney_key
    assert set(document["data"]["api_key"]) == {"*"}
    assert alive.whitney_key not in json.dumps(documents + [document])
    block_type = alive.api.get("/block_types/slug/whitney-credentials")
    assert block_type["name"] == "Whitney Credentials"


def test_a_triggered_run_completes_with_cycles_tasks_and_artifacts(
    alive: Stack, reference: dict[str, Any]
) -> None:
    flow_run = reference["flow_run"]
    assert flow_run["parameters"]["config"] == SMALL
    assert flow_run["parameters"]["whitney_block"] == BLOCK_NAME

    cycles = cycle_runs(alive, flow_run["id"])
    assert [run["state_type"] for run in cycles] == ["COMPLETED"] * SMALL["cycles"]
    check_task_runs(alive, cycles, SMALL["cycles"])

    last = 1 + sum(len(cycle_ops(index, SMALL["cycles"])) for index in range(SMALL["cycles"]))
    final = {f"save_state[seq={last}]", f"export_lora[seq={last + 1}]"}
    assert final <= set(task_run_names(alive, flow_run["id"], final))

    artifacts = alive.api.artifacts([flow_run["id"]] + [run["id"] for run in cycles])
    assert not [a for a in artifacts if a["type"] == "table"]
    progress = [a for a in artifacts if a["type"] == "progress"]
    assert len(progress) == 1 and float(progress[0]["data"]) == 100.0
    markdown = [a for a in artifacts if a["type"] == "markdown"]
    summaries = [a for a in markdown if a["flow_run_id"] == flow_run["id"]]
    assert len(summaries) == 1 and reference["sha256"] in summaries[0]["data"]
    # each cycle writes one artifact: its metrics, then its operations (seq ids, kinds, usage)
    per_cycle = [a for a in markdown if a["flow_run_id"] != flow_run["id"]]
    assert sorted(a["flow_run_id"] for a in per_cycle) == sorted(run["id"] for run in cycles)
    titles = sorted(a["data"].split("\n", 1)[0] for a in per_cycle)
    assert titles == [f"# Cycle {index}" for index in range(SMALL["cycles"])]
    for artifact in per_cycle:
        assert (
            "| reward_mean |" in artifact["data"]
            and "| forward_backward | succeeded |" in (artifact["data"])
        )

    # on Whitney: the labelled session is closed, its run finished after every seq id once
    assert [session.status for session in sessions_of(alive, flow_run["id"])] == ["closed"]
    run = reference["whitney_run"]
    assert run.next_seq_id == last + 2
    assert set(executions(alive, run.run_id).values()) == {1}

    # the flow run and its cycles reached Whitney through the block, whose key never shows: not
    # in the parameters, logs, artifacts, events or the deployment. Prefect's events are best
    # effort (its events worker drops one it fails to send, or whose run it fails to read)
    # and stored on their own clock: any load in the run or a cycle, waited for, is the record.
    run_ids = [flow_run["id"]] + [run["id"] for run in cycles]

    def loaded_in_the_run() -> list[dict[str, Any]] | None:
        found = alive.api.events([f"prefect.flow-run.{run_id}" for run_id in run_ids])
        loads = [e for e in found if e["event"] == "prefect.block.whitney-credentials.loaded"]
        return found if loads else None

    events = wait_for("the block's load event in the run", loaded_in_the_run, 60, interval=1.0)
    everything = json.dumps(
        [
            flow_run,
            cycles,
            artifacts,
            events,
            alive.deployment(),
            alive.api.logs(run_ids),
        ]
    )
    assert alive.whitney_key not in everything
    worker_log = next(p for p in alive.processes if p.name == "prefect-worker").log_text()
    assert alive.whitney_key not in worker_log


def test_a_run_cancelled_midway_leaves_nothing_open(alive: Stack) -> None:
    flow_run = trigger(alive, {**SMALL, "cycles": 60}, "e2e: cancelled mid-way")

    def cycle_done() -> bool:
        runs = alive.api.child_flow_runs(flow_run["id"])
        state = alive.api.flow_run(flow_run["id"])["state_type"]
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            raise HarnessError(f"the run ended {state} before it could be cancelled")
        return any(run["state_type"] == "COMPLETED" for run in runs)

    wait_for("a completed cycle", cycle_done, RUN_TIMEOUT_S, interval=0.5, evidence=alive.evidence)
    assert [s.status for s in sessions_of(alive, flow_run["id"])] == ["open"]

    # the UI's Cancel button
    alive.api.set_flow_run_state(
        flow_run["id"], {"type": "CANCELLING", "name": "Cancelling"}, force=True
    )
    cancelled = wait_run(alive, flow_run["id"], ["CANCELLED"])
    assert cancelled["state_type"] == "CANCELLED"
    completed_cycles = [
        run for run in alive.api.child_flow_runs(flow_run["id"]) if run["state_type"] == "COMPLETED"
    ]
    assert len(completed_cycles) < 60

    sessions = assert_nothing_open(alive, flow_run["id"])
    assert len(sessions) == 1
    runs = whitney_runs(alive, flow_run["id"])
    assert [run.status for run in runs] == ["cancelled"]


def test_a_failed_cycle_is_retried_by_prefect_and_replays_exactly(
    alive: Stack, reference: dict[str, Any]
) -> None:
    config = {**SMALL, "env": FAULT_ENV, "cycle_retries": 1}
    flow_run = trigger(alive, config, "e2e: cycle 1 fails once")
    done = wait_run(alive, flow_run["id"], ["COMPLETED"])

    cycles = cycle_runs(alive, done["id"])
    assert [run["state_type"] for run in cycles] == ["COMPLETED"] * SMALL["cycles"]
    assert [run["run_count"] for run in cycles] == [1, 2, 1]
    check_task_runs(alive, cycles, SMALL["cycles"])
    logs = json.dumps(alive.api.logs([cycles[1]["id"]]))
    assert "e2e fault: cycle 1 fails once" in logs

    run = finished_run(alive, done["id"])
    assert set(executions(alive, run.run_id).values()) == {1}, "a seq id ran twice"
    assert adapter_sha256(alive, run.run_id) == reference["sha256"]


def test_a_failed_run_retried_from_the_ui_resumes_exactly(
    alive: Stack, reference: dict[str, Any]
) -> None:
    config = {**SMALL, "env": FAULT_ENV, "cycle_retries": 0, "checkpoint_every": 1}
    flow_run = trigger(alive, config, "e2e: fails at cycle 1, then retried")
    failed = wait_run(alive, flow_run["id"], ["FAILED"])
    cycles = cycle_runs(alive, failed["id"])
    assert [run["state_type"] for run in cycles] == ["COMPLETED", "FAILED"]
    assert_nothing_open(alive, failed["id"])
    (cancelled,) = whitney_runs(alive, failed["id"])
    assert cancelled.status == "cancelled"
    checkpoint = f"whitney://runs/{cancelled.run_id}/states/cycle-0"
    saved = [op for op in journal(alive, cancelled.run_id) if op.kind == "save_state"]
    assert [(op.status, op.result["checkpoint"]) for op in saved] == [("succeeded", checkpoint)]

    # the UI's Retry button on the failed deployed run
    alive.api.set_flow_run_state(
        failed["id"],
        {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"},
        force=False,
    )
    done = wait_run(alive, failed["id"], ["COMPLETED"])
    assert done["run_count"] == 2
    run = finished_run(alive, done["id"])
    assert set(executions(alive, run.run_id).values()) == {1}
    assert set(executions(alive, cancelled.run_id).values()) == {1}
    assert adapter_sha256(alive, run.run_id) == reference["sha256"]

    # it found the failed attempt's checkpoint after cycle 0 by its session label and went on
    # from cycle 1 on a new run created from it: cycle 0 trained once, on the first run only
    assert run.model_extra["from_checkpoint"] == checkpoint
    count = SMALL["cycles"]
    resumed = [op.kind for op in journal(alive, run.run_id)]
    layout = [cycle_ops(index, count, 1, 1) for index in range(1, count)]
    assert resumed == [kind for ops in layout for kind in ops] + ["save_state", "export_lora"]
    first_attempt = journal(alive, cancelled.run_id)
    trained = [op for op in first_attempt if op.kind == "optim_step"]
    assert [op.status for op in trained] == ["succeeded"]
    children = alive.api.child_flow_runs(done["id"])
    names = [(cycle["name"], cycle["state_type"]) for cycle in children]
    assert names == [
        ("cycle-0", "COMPLETED"),
        ("cycle-1", "FAILED"),
        ("cycle-1", "COMPLETED"),
        ("cycle-2", "COMPLETED"),
    ]
    check_task_runs(alive, children[2:], count, first=1, checkpoint_every=1)


def test_a_missing_block_fails_the_run_before_anything_is_allocated(alive: Stack) -> None:
    flow_run = trigger(alive, dict(SMALL), "e2e: no such block", block="no-such-block")
    failed = wait_run(alive, flow_run["id"], ["FAILED"])
    # the flow run's process ships its logs in batches: the error may land after the state
    message = "no WhitneyCredentials block named 'no-such-block'"

    def error_logged() -> str | None:
        logs = json.dumps(alive.api.logs([failed["id"]]))
        return logs if message in logs else None

    logs = wait_for("the flow run's error in its logs", error_logged, 30, interval=0.5)
    assert "python -m blocks save no-such-block" in logs
    assert alive.api.child_flow_runs(failed["id"]) == []
    assert sessions_of(alive, failed["id"]) == []
