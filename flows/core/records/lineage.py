"""Forks: a flow run started from another run's `cycle-{n}` checkpoint (`resume_from`), with
its lineage: the parent run, the cycle, and what changed (the two configs' difference).

A fork is `resume_from` and nothing else: the same resume point (tasks.resume), a new run
created from the checkpoint, the same seq-id layout, so a fork with nothing changed trains the
parent's later cycles bit for bit. What a fork adds is the record of where it came from:

    find_lineage(connection, config)   the parent's Whitney run and session, its flow run
                                       (the session's `prefect.flow-run-id` label) and that
                                       flow run's `config` parameter on this Prefect server;
                                       the changed fields, dotted, parent -> fork
    run_forked (flows.core.records.events)     `whitney.run.forked`, when the fork's run is created
    lineage_artifact                   at the normal end: the changes and one picture of the
                                       parent's and the fork's loss by optimizer step

Some fields cannot change in a fork (`FIXED_IN_FORK`): the checkpoint holds LoRA weights of
one base model and rank, on one provider, over one tokenizer's ids.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any, Literal
from uuid import UUID

from prefect import get_client
from prefect.artifacts import create_markdown_artifact
from prefect.exceptions import ObjectNotFound
from pydantic import BaseModel, Field, ValidationError

from blocks.connection import WhitneyConnection
from flows.core.config import ConfigError, FlowConfig
from flows.core.records.manifest import RUN_LOCAL_FIELDS, flat_settings
from flows.core.records.plots import Line, Panel, render_png
from tasks.names import FLOW_RUN_LABEL, checkpoint_cycle
from whitney import wire
from whitney.client import WhitneyClient
from whitney.uris import checkpoint_run_id

FIXED_IN_FORK = ("provider", "base_model", "lora_rank", "tokenizer")
"""Fields a fork keeps from its parent: the checkpoint's weights are of them."""
NOT_SETTINGS = RUN_LOCAL_FIELDS | {"resume_from"}
"""Fields that say where a run ran or starts, left out of a fork's changes."""
CONTINUATION_FIELDS = frozenset({"cycles", "steps", "tracking"})
"""Fields a run resumed to train further changes without branching: how long, where logged."""


class Change(BaseModel):
    """One changed field: its value in the parent's config and in the fork's."""

    parent: Any
    fork: Any


class Lineage(BaseModel):
    """Where a run started from another run's checkpoint came from."""

    kind: Literal["fork", "resume"] = Field(
        description="fork: settings changed (or the parent's are unknown); resume: none changed"
    )
    parent_run_id: str
    parent_checkpoint: str
    cycle: int = Field(description="The parent's cycle the checkpoint was saved after")
    parent_flow_run_id: str | None = Field(
        description="The parent's Prefect flow run (its session's label), if it has one"
    )
    changes: dict[str, Change] | None = Field(
        description="Dotted field -> parent and fork values; None: the parent's config is not "
        "on this Prefect server"
    )


def branches(lineage: Lineage | None) -> bool:
    """Whether a run with this lineage is a branch of its parent's training, not its
    continuation: a setting beyond `CONTINUATION_FIELDS` changed, or the parent's are unknown."""
    if lineage is None or lineage.changes is None:
        return lineage is not None
    return any(field.split(".")[0] not in CONTINUATION_FIELDS for field in lineage.changes)


def config_changes(parent: Mapping[str, Any], fork: Mapping[str, Any]) -> dict[str, Change]:
    """The settings that differ between two configs (as JSON), by dotted field, leaving out
    where each ran (`NOT_SETTINGS`)."""
    before, after = flat_settings(parent), flat_settings(fork)
    return {
        field: Change(parent=before.get(field), fork=after.get(field))
        for field in sorted(before.keys() | after.keys())
        if field.split(".")[0] not in NOT_SETTINGS and before.get(field) != after.get(field)
    }


def check_fixed(changes: Mapping[str, Change], checkpoint: str) -> None:
    """ConfigError naming the first changed field a fork of `checkpoint` cannot change."""
    for field in FIXED_IN_FORK:
        if field in changes:
            change = changes[field]
            raise ConfigError(
                field,
                f"cannot change in a fork of {checkpoint} (its weights are of "
                f"{field}={change.parent!r}, not {change.fork!r})",
            )


def parent_flow_run_id(client: WhitneyClient, run_id: str) -> str | None:
    """The Prefect flow run that opened the run's session (its label), if any."""
    session = client.get_session(client.get_run(run_id).session_id)
    return (session.labels or {}).get(FLOW_RUN_LABEL)


def parent_config(flow_run_id: str | None, model: type[FlowConfig]) -> dict[str, Any] | None:
    """The `config` parameter of the flow run `flow_run_id` on this Prefect server, completed
    with `model`'s defaults as the parent's flow run did (a deployment's parameters hold only
    the fields given); None if it is not there or no longer validates."""
    if flow_run_id is None:
        return None
    try:
        with get_client(sync_client=True) as prefect:
            flow_run = prefect.read_flow_run(UUID(flow_run_id))
    except (ObjectNotFound, ValueError):
        return None
    config = flow_run.parameters.get("config")
    if not isinstance(config, dict):
        return None
    try:
        return model.model_validate(config).model_dump(mode="json")
    except ValidationError:
        return None


def find_lineage(connection: WhitneyConnection, config: FlowConfig) -> Lineage | None:
    """The lineage of a run started from `config.resume_from` (None without it);
    ConfigError naming a field that changed and cannot (`FIXED_IN_FORK`)."""
    checkpoint = config.resume_from
    if not checkpoint:
        return None
    parent_run = checkpoint_run_id(checkpoint)
    with connection.get_client() as client:
        flow_run_id = parent_flow_run_id(client, parent_run)
    parent = parent_config(flow_run_id, type(config))
    changes = None
    if parent is not None:
        changes = config_changes(parent, config.model_dump(mode="json"))
        check_fixed(changes, checkpoint)
    return Lineage(
        kind="resume" if changes == {} else "fork",
        parent_run_id=parent_run,
        parent_checkpoint=checkpoint,
        cycle=checkpoint_cycle(checkpoint),
        parent_flow_run_id=flow_run_id,
        changes=changes,
    )


def loss_by_step(operations: Iterable[wire.Operation]) -> list[tuple[float, float]]:
    """(optimizer step, loss of the forward_backward before it) over a run's journal."""
    points: list[tuple[float, float]] = []
    loss: float | None = None
    for operation in operations:
        if operation.status != "succeeded" or operation.result is None:
            continue
        if operation.kind == "forward_backward":
            loss = wire.ForwardResult.model_validate(operation.result).loss
        elif operation.kind == "optim_step" and loss is not None:
            points.append((wire.OptimStepResult.model_validate(operation.result).step, loss))
    return points


def lineage_curves(connection: WhitneyConnection, lineage: Lineage, run_id: str) -> Panel:
    """The parent's and the fork's loss by optimizer step, from their journals, in one panel
    (the step continues across the checkpoint: its optimizer state holds it)."""
    with connection.get_client() as client:
        parent = loss_by_step(client.iter_journal(lineage.parent_run_id))
        fork = loss_by_step(client.iter_journal(run_id))
    return Panel(
        f"loss, forked after cycle {lineage.cycle}",
        "optimizer step",
        [Line(f"parent {lineage.parent_run_id}", parent), Line(f"fork {run_id}", fork)],
    )


def lineage_markdown(lineage: Lineage, run_id: str, curves: Panel | None = None) -> str:
    """The lineage as markdown: parent, cycle, the changes table, the curves picture."""
    lines = [
        f"# {lineage.kind.capitalize()} of run `{lineage.parent_run_id}` after cycle "
        f"{lineage.cycle}",
        "",
        f"Run `{run_id}` started from `{lineage.parent_checkpoint}` (parent flow run "
        f"`{lineage.parent_flow_run_id}`).",
        "",
    ]
    if lineage.changes is None:
        lines.append("The parent's config is not on this Prefect server: changes unknown.")
    elif not lineage.changes:
        lines.append("No setting changed.")
    else:
        lines += ["| setting | parent | fork |", "| --- | --- | --- |"]
        lines += [
            f"| {field} | `{change.parent!r}` | `{change.fork!r}` |"
            for field, change in lineage.changes.items()
        ]
    if curves is not None:
        data = base64.b64encode(render_png([curves])).decode("ascii")
        lines += ["", f"![parent and fork](data:image/png;base64,{data})"]
    return "\n".join(lines)


def lineage_artifact(
    connection: WhitneyConnection, lineage: Lineage, run_id: str, key: str
) -> UUID:
    """The fork's lineage artifact (`key`): parent, cycle, changes, the two curves."""
    curves = lineage_curves(connection, lineage, run_id)
    return create_markdown_artifact(
        markdown=lineage_markdown(lineage, run_id, curves),
        key=key,
        description=f"Lineage of run {run_id}: parent, cycle, what changed, both curves",
    )
