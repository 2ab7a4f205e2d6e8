"""Resume: where a flow run starts, from the server's journal, with nothing kept in memory.

Every `checkpoint_every` cycles a cycle ends with `save_state` named `cycle-{n}` (weights and
optimizer state), so `whitney://runs/{run_id}/states/cycle-{n}` means "the state after cycle
n". A flow run starts in one of three ways:

- a retried flow run (`flow_run.run_count > 1`: the UI's Retry on a deployed run,
  `prefect flow-run retry`, or Prefect's own flow `retries`): its earlier attempts' sessions
  bear the same label `prefect.flow-run-id=<id>`; their runs' journals hold the checkpoints.
  It resumes from the latest `cycle-{n}` checkpoint that only succeeded operations precede
  (a pipelined tail may have executed operations behind a failure: a checkpoint after a
  failed operation is not trusted), on a new run created `from_checkpoint`, at cycle n+1;
- `resume_from=<checkpoint>` in the config: the same, from a checkpoint of any earlier run;
- otherwise: a new run from the base model, at cycle 0.

Trainable auxiliary runs (a critic) save their own `cycle-{n}` checkpoint at the same cycles
(`save_auxiliary_checkpoints`) and are created from it on resume: `ResumePoint.checkpoints`
holds one per run name (`policy`, or the auxiliary run's name, from its label), and a retry
resumes from the latest cycle that every checkpointed run saved. A frozen run (a reference)
starts from its base model, as it did the first time.

`prefect flow-run retry <id>` in Prefect 3.9.1 (read in its source, exercised by
tests/flows/core/test_resume.py): a deployed run is forced to Scheduled for a worker to pick up; a
run without a deployment needs `--entrypoint flows/rl/flow.py:rl_flow`, is forced to Scheduled and
runs in the CLI's process under the same flow run id with its stored parameters
(`prefect.flow_engine.run_flow(flow, flow_run=...)`). Either way the attempt sees
`run_count == 2`.

Sampling seeds derive from (seed, cycle, prompt index) and the checkpoint restores the
optimizer's moments and step, so a resumed flow trains exactly as an undisturbed one: the same
adapter, bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from uuid import UUID

from prefect import get_run_logger, task

from blocks.connection import WhitneyConnection, client_for
from tasks.names import AUXILIARY_LABEL, CYCLE_CHECKPOINT, FLOW_RUN_LABEL, checkpoint_cycle
from tasks.operations import TASK_DEFAULTS
from tasks.release import release_sessions
from whitney import wire
from whitney.client import WhitneyClient

POLICY = "policy"


@dataclass(frozen=True)
class ResumePoint:
    """Where a flow run starts: its first cycle, and the checkpoint of each role to create
    its runs from (none: from the base model)."""

    first_cycle: int = 0
    checkpoints: dict[str, str] = field(default_factory=dict)
    """By run name: `policy`, or an auxiliary run's name (e.g. `critic`)."""
    source: str = "start"
    """start, retry (an earlier attempt's checkpoint) or resume_from."""

    @property
    def checkpoint(self) -> str | None:
        """The policy run's checkpoint."""
        return self.checkpoints.get(POLICY)


def run_name(run: wire.Run) -> str:
    """`policy`, or the auxiliary run's name from its label. (A flow's session holds one
    trainable run without that label: its policy, or a distillation's student.)"""
    labels = (run.model_extra or {}).get("labels") or {}
    return str(labels.get(AUXILIARY_LABEL) or POLICY)


def run_checkpoints(client: WhitneyClient, run_id: str) -> dict[int, str]:
    """The run's `cycle-{n}` checkpoints by cycle, those that only succeeded operations
    precede in its journal."""
    found: dict[int, str] = {}
    for expected, operation in enumerate(client.iter_journal(run_id), start=1):
        if operation.seq_id != expected or operation.status != "succeeded":
            return found  # a gap, or an operation that did not succeed: stop trusting
        uri = (operation.result or {}).get("checkpoint")
        if operation.kind == "save_state" and isinstance(uri, str):
            match = CYCLE_CHECKPOINT.match(uri)
            if match is not None:
                found[int(match["cycle"])] = uri
    return found


def checkpoints_by_name(client: WhitneyClient, run_ids: Iterable[str]) -> dict[str, dict[int, str]]:
    """The trusted cycle checkpoints of these runs, by run name and cycle."""
    found: dict[str, dict[int, str]] = {}
    for run_id in run_ids:
        checkpoints = run_checkpoints(client, run_id)
        if checkpoints:
            named = found.setdefault(run_name(client.get_run(run_id)), {})
            for cycle, uri in checkpoints.items():
                named.setdefault(cycle, uri)
    return found


def latest_checkpoints(client: WhitneyClient, flow_run_id: UUID | str) -> ResumePoint | None:
    """The latest cycle after which the flow run's earlier attempts saved a trusted checkpoint
    of the policy and of every other run they checkpointed, with those checkpoints; None if
    there is none."""
    run_ids = [
        run_id
        for session in client.list_sessions(label=f"{FLOW_RUN_LABEL}:{flow_run_id}")
        for run_id in client.get_session(session.session_id).run_ids or []
    ]
    found = checkpoints_by_name(client, run_ids)
    if POLICY not in found:
        return None
    common = set.intersection(*(set(cycles) for cycles in found.values()))
    if not common:
        return None
    cycle = max(common)
    checkpoints = {name: cycles[cycle] for name, cycles in found.items()}
    return ResumePoint(first_cycle=cycle + 1, checkpoints=checkpoints, source="retry")


def checkpoints_beside(client: WhitneyClient, checkpoint: str) -> dict[str, str]:
    """The policy checkpoint `checkpoint` with those the auxiliary runs of its session saved
    after the same cycle (a critic's), by run name."""
    match = CYCLE_CHECKPOINT.match(checkpoint)
    if match is None:
        raise ValueError(f"not a cycle checkpoint: {checkpoint!r}")
    cycle, policy_run = int(match["cycle"]), match["run_id"]
    session = client.get_session(client.get_run(policy_run).session_id)
    others = [run_id for run_id in session.run_ids or [] if run_id != policy_run]
    beside = {
        name: cycles[cycle]
        for name, cycles in checkpoints_by_name(client, others).items()
        if name != POLICY and cycle in cycles
    }
    return {POLICY: checkpoint, **beside}


def resume_point(
    client: WhitneyClient,
    flow_run_id: UUID | str,
    run_count: int,
    resume_from: str | None,
    cleanup_timeout_s: float,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> ResumePoint:
    """Where this attempt of the flow run starts (see the module docstring).

    A retried attempt first releases what earlier attempts left open (an in-process flow retry
    runs no failure hook in between), so it never trains beside a live run of its own.
    """
    if run_count > 1:
        release_sessions(client, flow_run_id, cleanup_timeout_s, logger)
        found = latest_checkpoints(client, flow_run_id)
        if found is not None:
            logger.info(
                "Attempt %d resumes after cycle %d from %s",
                run_count,
                found.first_cycle - 1,
                found.checkpoint,
            )
            return found
        logger.info("Attempt %d: no checkpoint of an earlier attempt to resume from", run_count)
    if resume_from:
        cycle = checkpoint_cycle(resume_from)
        checkpoints = checkpoints_beside(client, resume_from)
        logger.info("Resuming after cycle %d from %s", cycle, ", ".join(checkpoints.values()))
        return ResumePoint(first_cycle=cycle + 1, checkpoints=checkpoints, source="resume_from")
    return ResumePoint()


@task(name="find_resume_point", **TASK_DEFAULTS)
def find_resume_point(
    connection: WhitneyConnection,
    flow_run_id: UUID,
    run_count: int,
    resume_from: str | None,
    cleanup_timeout_s: float,
) -> ResumePoint:
    """Where this flow run attempt starts: the latest trusted checkpoint of its earlier
    attempts, else `resume_from`, else cycle 0 from the base model."""
    return resume_point(
        client_for(connection),
        flow_run_id,
        run_count,
        resume_from,
        cleanup_timeout_s,
        get_run_logger(),
    )
