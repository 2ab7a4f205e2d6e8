"""Forks (flows.core.records.lineage, `whitney-flows fork`): a fork with nothing changed trains the
parent's later cycles bit for bit; a fork with a changed learning rate differs and records its
lineage (the result, the `whitney.run.forked` event, the lineage artifact with both curves);
the command refuses, naming the field, a cycle with no checkpoint, an unknown field and one a
fork cannot change. One parent RL run on local/tiny (flowtest_parent) serves every test but
the command's fork of a DPO run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from flowtest_parent import Parent, parent_run
from flowtest_settings import QUICK_RECOVERY
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from flows.cli.main import main
from flows.core.records import events
from flows.core.records.lineage import (
    Change,
    Lineage,
    config_changes,
    lineage_markdown,
    parent_config,
)
from flows.core.records.manifest import write_manifest
from flows.core.records.run_records import artifact_key
from flows.core.records.tracking.config import TrackingSettings
from flows.dpo.config import DPOConfig
from flows.dpo.flow import dpo_flow
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

COMPARED = ("reward_mean", "reward_std", "all_zero_group_share", "loss", "grad_norm")
COMPARED_TOKENS = ("tokens_sampled", "tokens_trained")


@pytest.fixture
def parent(whitney: EmbeddedWhitney) -> Parent:
    return parent_run(whitney.url)


def checkpoint(parent: Parent, cycle: int) -> str:
    return parent.checkpoint(cycle)


def compared(cycle: Any) -> dict[str, Any]:
    """A cycle's numbers and its inline evaluation's (not timings, seq ids or run URIs)."""
    numbers = {name: getattr(cycle, name) for name in (*COMPARED, *COMPARED_TOKENS)}
    evaluation = cycle.eval.model_dump(exclude={"seconds"}) if cycle.eval else None
    return {**numbers, "eval": evaluation}


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every event the flows emit during the test."""
    seen: list[dict[str, Any]] = []
    real = events.emit_event

    def record(event: str, **options: Any) -> Any:
        seen.append({"event": event, **options})
        return real(event, **options)

    monkeypatch.setattr(events, "emit_event", record)
    return seen


def test_a_fork_with_nothing_changed_reproduces_the_later_cycles_bit_for_bit(
    parent: Parent, emitted: list[dict[str, Any]]
) -> None:
    fork = rl_flow(parent.config.model_copy(update={"resume_from": checkpoint(parent, 1)}))
    assert [cycle.cycle for cycle in fork.cycles] == [2, 3]
    assert [compared(c) for c in fork.cycles] == [compared(c) for c in parent.result.cycles[2:]]
    assert fork.adapter.sha256 == parent.result.adapter.sha256
    assert fork.run_id != parent.result.run_id
    lineage = fork.lineage
    assert lineage is not None
    assert (lineage.kind, lineage.changes, lineage.cycle) == ("resume", {}, 1)
    assert lineage.parent_run_id == parent.result.run_id
    assert lineage.parent_flow_run_id == str(parent.flow_run_id)
    (forked,) = [event for event in emitted if event["event"] == "whitney.run.forked"]
    assert forked["payload"]["changes"] == {}
    assert forked["payload"]["parent_checkpoint"] == checkpoint(parent, 1)


def test_a_fork_with_a_changed_learning_rate_differs_and_records_its_lineage(
    parent: Parent, emitted: list[dict[str, Any]], inspector: WhitneyClient
) -> None:
    config = parent.config.model_copy(
        update={"resume_from": checkpoint(parent, 1), "learning_rate": 0.02}
    )
    fork = rl_flow(config)
    # cycle 2 samples the checkpoint's weights: the same numbers; its steps then differ
    assert compared(fork.cycles[0]) == compared(parent.result.cycles[2])
    steps = [op for op in inspector.iter_journal(fork.run_id) if op.kind == "optim_step"]
    assert [op.result["metrics"]["learning_rate"] for op in steps] == [0.02, 0.02]
    assert [op.result["step"] for op in steps] == [3, 4]  # the checkpoint's optimizer goes on
    assert fork.adapter.sha256 != parent.result.adapter.sha256
    assert fork.lineage is not None and fork.lineage.kind == "fork"
    assert fork.lineage.changes == {"learning_rate": Change(parent=2e-3, fork=0.02)}
    assert fork.manifest["lineage"] == fork.lineage.model_dump(mode="json")
    (forked,) = [event for event in emitted if event["event"] == "whitney.run.forked"]
    assert forked["payload"]["changes"] == {"learning_rate": {"parent": 2e-3, "fork": 0.02}}
    assert forked["payload"]["run_id"] == fork.run_id
    assert inspector.get_run(fork.run_id).from_checkpoint == checkpoint(parent, 1)
    with get_client(sync_client=True) as prefect:
        key = artifact_key("lineage", fork.run_id)
        (artifact,) = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    markdown = str(artifact.data)
    assert "| learning_rate | `0.002` | `0.02` |" in markdown
    assert "![parent and fork](data:image/png;base64," in markdown


def write_parent_manifest(parent: Parent, directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"{parent.result.run_id}-manifest.json"
    return write_manifest(parent.result.manifest, path)


def test_the_fork_command_runs_a_fork_of_the_manifest(
    parent: Parent, tmp_path: Path, capsys: pytest.CaptureFixture[str], whitney: EmbeddedWhitney
) -> None:
    adapters = tmp_path / "adapters"
    write_parent_manifest(parent, adapters)
    arguments = ["--cycle", "2", "--set", "learning_rate=0.01", "--set", "cycles=4"]
    code = main(
        ["fork", parent.result.run_id, *arguments, "--api-url", whitney.url]
        + ["--adapter-dir", str(adapters), "--metrics-out", str(tmp_path / "fork.jsonl")]
    )
    assert code == 0, capsys.readouterr().err
    lines = (tmp_path / "fork.jsonl").read_text().splitlines()
    assert [json.loads(line)["cycle"] for line in lines] == [3]
    manifests = adapters.glob("*-manifest.json")
    (manifest,) = [path for path in manifests if parent.result.run_id not in path.name]
    written = json.loads(manifest.read_text())
    assert written["lineage"]["parent_checkpoint"] == checkpoint(parent, 2)
    assert written["lineage"]["changes"] == {"learning_rate": {"parent": 2e-3, "fork": 0.01}}
    (archive,) = written["files"]  # the downloaded archive, beside the manifest
    assert (
        written["files"][archive] == hashlib.sha256((adapters / archive).read_bytes()).hexdigest()
    )
    capsys.readouterr()
    assert main(["export", "--verify", str(manifest)]) == 0
    assert capsys.readouterr().out.startswith(f"ok            file {archive}: ")


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        (["--cycle", "7"], "--cycle: run {run} saved no checkpoint after cycle 7 (it has cycles"),
        (["--cycle", "1", "--set", "no_such=1"], "--set no_such: RLConfig has no such field"),
        (
            ["--cycle", "1", "--set", "learning_rat=0.1"],
            "--set learning_rat: RLConfig has no such field (did you mean learning_rate?)",
        ),
        (["--cycle", "1", "--set", "base_model=local/nano"], "--set base_model: cannot change"),
        (["--cycle", "1", "--set", "lora_rank=4"], "--set lora_rank: cannot change in a fork"),
        (["--cycle", "1", "--set", "learning_rate"], "--set: 'learning_rate': expected FIELD="),
    ],
    ids=["no-checkpoint", "unknown-field", "nearest-field", "base-model", "lora-rank", "no-value"],
)
def test_the_fork_command_refuses_naming_the_field(
    parent: Parent,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    whitney: EmbeddedWhitney,
    arguments: list[str],
    needle: str,
) -> None:
    manifest = write_parent_manifest(parent, tmp_path)
    code = main(["fork", str(manifest), *arguments, "--api-url", whitney.url])
    error = capsys.readouterr().err
    assert code == 2
    assert error.count("\n") == 1 and error.startswith("whitney-flows fork: ")
    assert needle.format(run=parent.result.run_id) in error


def test_a_changed_field_that_cannot_change_is_refused_by_the_flow_too(
    parent: Parent, inspector: WhitneyClient
) -> None:
    from flows.core.config import ConfigError

    sessions = len(inspector.list_sessions())
    config = parent.config.model_copy(update={"resume_from": checkpoint(parent, 1), "lora_rank": 4})
    with pytest.raises(ConfigError, match="lora_rank: cannot change in a fork"):
        rl_flow(config)
    assert len(inspector.list_sessions()) == sessions  # refused before anything is allocated


def test_the_changes_are_the_differing_settings_dotted_not_where_a_run_ran() -> None:
    parent = {"learning_rate": 0.002, "budget": {"max_cost": 1.0, "max_tokens": None}}
    fork = {"learning_rate": 0.002, "budget": {"max_cost": 2.5, "max_tokens": None}}
    parent |= {"api_url": "http://a", "metrics_path": "a.jsonl", "resume_from": None}
    fork |= {"api_url": "http://b", "metrics_path": None, "resume_from": "whitney://x"}
    assert config_changes(parent, fork) == {"budget.max_cost": Change(parent=1.0, fork=2.5)}
    assert config_changes(parent, {**parent, "seed": 3}) == {"seed": Change(parent=None, fork=3)}


def test_a_fork_whose_parent_config_is_unknown_still_names_its_parent() -> None:
    lineage = Lineage(
        kind="fork",
        parent_run_id="run-p",
        parent_checkpoint="whitney://runs/run-p/states/cycle-4",
        cycle=4,
        parent_flow_run_id=None,
        changes=None,
    )
    markdown = lineage_markdown(lineage, "run-f")
    assert markdown.startswith("# Fork of run `run-p` after cycle 4")
    assert "changes unknown" in markdown


def tensorboard_run(directory: Path) -> tuple[str, str]:
    """The one TensorBoard run under `directory`: its directory name and its tag tables."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_directory,) = (directory / "tensorboard").iterdir()
    events = EventAccumulator(str(run_directory), size_guidance={"tensors": 0})
    events.Reload()
    tables = [
        text.decode() for event in events.Tensors("tags") for text in event.tensor_proto.string_val
    ]
    return run_directory.name, "\n".join(tables)


def test_a_branching_fork_is_its_own_tracked_run_and_a_longer_resume_continues_its_parents(
    parent: Parent, tmp_path: Path
) -> None:
    """A fork that changes how it trains starts a tracked run of its own, tagged with its
    parent; a resume that only trains further (more cycles) continues the parent's lineage."""
    forked = tmp_path / "fork"
    config = parent.config.model_copy(
        update={
            "resume_from": checkpoint(parent, 1),
            "learning_rate": 0.02,
            "tracking": TrackingSettings(backends=["tensorboard"], dir=str(forked)),
        }
    )
    state = rl_flow(config, return_state=True)
    assert state.is_completed(), state.message
    name, tags = tensorboard_run(forked)
    assert name.endswith(str(state.state_details.flow_run_id))
    assert f"| whitney.fork.parent_run_id | {parent.result.run_id} |" in tags
    assert f"| whitney.fork.parent_flow_run_id | {parent.flow_run_id} |" in tags
    assert "| whitney.fork.cycle | 1 |" in tags
    assert "learning_rate" in tags

    longer = tmp_path / "longer"
    config = parent.config.model_copy(
        update={
            "resume_from": checkpoint(parent, 3),
            "cycles": parent.config.cycles + 1,
            "tracking": TrackingSettings(backends=["tensorboard"], dir=str(longer)),
        }
    )
    assert rl_flow(config).lineage.kind == "fork"  # cycles changed: recorded, not a branch
    name, tags = tensorboard_run(longer)
    assert name.endswith(str(parent.flow_run_id))
    assert "whitney.fork." not in tags


def test_a_deployed_parents_partial_config_is_completed_with_the_defaults() -> None:
    """A deployment's flow run holds only the fields given: the parent's config is what its
    flow validated, so the defaults are not changes (a resume changes nothing)."""
    with get_client(sync_client=True) as prefect:
        flow_run = prefect.create_flow_run(rl_flow, parameters={"config": {"cycles": 3}})
    completed = parent_config(str(flow_run.id), RLConfig)
    assert completed == RLConfig(cycles=3).model_dump(mode="json")
    assert config_changes(completed, RLConfig(cycles=3).model_dump(mode="json")) == {}


def test_the_fork_command_forks_a_dpo_run(
    whitney: EmbeddedWhitney, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DPO run's manifest is a training flow's like any other (flows.catalogue): its fork
    trains the cycle after the checkpoint with the changed beta, and says so."""
    pairs = Path(__file__).resolve().parents[3] / "examples" / "dpo-pairs.jsonl"
    config = DPOConfig(
        api_url=whitney.url,
        base_model="local/tiny",
        data_path=str(pairs),
        cycles=2,
        pairs_per_cycle=4,
        beta=0.1,
        learning_rate=5e-4,
        checkpoint_every=1,
        seed=1,
        **QUICK_RECOVERY,
    )
    state = dpo_flow(config, return_state=True)
    assert state.is_completed(), state.message
    parent = state.result()
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    write_manifest(parent.manifest, adapters / f"{parent.run_id}-manifest.json")
    code = main(
        ["fork", parent.run_id, "--cycle", "0", "--set", "beta=0.2", "--api-url", whitney.url]
        + ["--adapter-dir", str(adapters), "--metrics-out", str(tmp_path / "fork.jsonl")]
    )
    assert code == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in (tmp_path / "fork.jsonl").read_text().splitlines()]
    assert [line["cycle"] for line in lines] == [1]
    (manifest,) = [
        path for path in adapters.glob("*-manifest.json") if parent.run_id not in path.name
    ]
    written = json.loads(manifest.read_text())
    assert written["flow"] == "dpo" and written["config"]["beta"] == 0.2
    assert (
        written["lineage"]["parent_checkpoint"] == f"whitney://runs/{parent.run_id}/states/cycle-0"
    )
    assert written["lineage"]["changes"] == {"beta": {"parent": 0.1, "fork": 0.2}}
