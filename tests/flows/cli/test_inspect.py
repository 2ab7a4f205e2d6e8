"""`whitney-flows inspect` and `runs`: cycles found in journals of every shape, and the
commands on a finished distillation run, through the API and through the data directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator

import pytest
from flowtest_cli import CONSOLE_SCRIPT
from flowtest_distill import small_distill_config

from flows.cli.inspection import created_text
from flows.cli.main import main
from flows.core.records.inspection_journal import cycle_groups, run_report
from flows.core.records.inspection_sources import ApiJournal, DataDirJournal
from flows.distill.flow import distillation_flow
from flows.distill.metrics import DistillationResult
from whitney import wire
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


def journal_of(*specs: tuple[str, str | None]) -> list[wire.Operation]:
    """Operations seq 1.. of (kind, sampler name for a save_weights_for_sampler)."""
    operations = []
    for seq, (kind, name) in enumerate(specs, start=1):
        result = {"sampler_id": name} if kind == "save_weights_for_sampler" else {}
        operations.append(
            wire.Operation(run_id="run", seq_id=seq, kind=kind, status="succeeded", result=result)
        )
    return operations


def labels(operations: list[wire.Operation]) -> list[tuple[str, list[int]]]:
    return [
        (group.label, [op.seq_id for op in group.operations]) for group in cycle_groups(operations)
    ]


def test_unnamed_samplers_count_cycles_and_the_end_is_final() -> None:
    operations = journal_of(
        ("save_weights_for_sampler", "sampler-1"),
        ("sample", None),
        ("forward_backward", None),
        ("optim_step", None),
        ("save_weights_for_sampler", "sampler-5"),
        ("sample", None),
        ("forward_backward", None),
        ("optim_step", None),
        ("save_state", None),
        ("export_lora", None),
    )
    assert labels(operations) == [
        ("cycle 0", [1, 2, 3, 4]),
        ("cycle 1", [5, 6, 7, 8]),
        ("final", [9, 10]),
    ]


def test_named_samplers_name_their_cycle_and_other_names_their_group() -> None:
    operations = journal_of(
        ("save_weights_for_sampler", "eval-start"),
        ("logprobs", None),
        ("save_weights_for_sampler", "cycle-3"),
        ("sample", None),
        ("forward_backward", None),
        ("optim_step", None),
        ("save_state", None),  # a mid-run checkpoint stays in its cycle
        ("save_weights_for_sampler", "cycle-4"),
        ("sample", None),
        ("forward_backward", None),
        ("optim_step", None),
        ("save_weights_for_sampler", "eval-end"),
        ("logprobs", None),
        ("save_state", None),
        ("export_lora", None),
    )
    groups = cycle_groups(operations)
    assert [(g.label, g.cycle) for g in groups] == [
        ("eval-start", None),
        ("cycle 3", 3),
        ("cycle 4", 4),
        ("eval-end", None),
        ("final", None),
    ]
    assert [op.kind for op in groups[1].operations][-1] == "save_state"


def test_a_journal_without_samplers_goes_by_optimizer_step() -> None:
    operations = journal_of(
        ("forward", None),  # the eval before the first step
        ("forward_backward", None),
        ("optim_step", None),
        ("forward_backward", None),
        ("optim_step", None),
        ("forward", None),  # an eval after step 1
        ("save_state", None),  # a cycle checkpoint
        ("forward_backward", None),
        ("optim_step", None),
        ("save_state", None),
        ("export_lora", None),
    )
    assert labels(operations) == [
        ("setup", [1]),
        ("step 0", [2, 3]),
        ("step 1", [4, 5, 6, 7]),
        ("step 2", [8, 9]),
        ("final", [10, 11]),
    ]


def test_an_unfinished_journal_has_no_final() -> None:
    unfinished = journal_of(("save_weights_for_sampler", "cycle-0"), ("save_state", None))
    assert labels(unfinished) == [("cycle 0", [1, 2])]


@pytest.fixture(scope="module")
def finished(embedded_server: EmbeddedWhitney) -> Iterator[DistillationResult]:
    """A small distillation run (3 cycles, the base model as its teacher) on the shared
    server."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WHITNEY_API_KEY", embedded_server.api_key)
        config = small_distill_config(
            embedded_server.url,
            cycles=3,
            prompts_per_cycle=3,
            checkpoint_every=2,
            eval_fraction=0.02,
        )
        yield distillation_flow(config)


def inspect_json(capsys: pytest.CaptureFixture[str], *arguments: str) -> dict:
    assert main(["inspect", *arguments, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_lists_every_seq_id_of_the_journal_once(
    finished: DistillationResult,
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for run_id in (finished.run_id, finished.teacher_run_id):
        report = inspect_json(capsys, run_id, "--api-url", whitney.url)
        journal = [op.seq_id for op in inspector.journal(run_id, limit=1000)]
        listed = [row["seq_id"] for group in report["groups"] for row in group["operations"]]
        assert listed == journal == list(range(1, len(journal) + 1))
        assert report["cycles_in_journal"] == [0, 1, 2]
        assert report["operations"] == len(journal)
        assert report["run"]["run_id"] == run_id
        for group in report["groups"]:
            for row in group["operations"]:
                assert row["status"] == "succeeded"
                assert row["duration_s"] is not None and row["duration_s"] >= 0
                assert "tokens" in row["usage"]
    student = inspect_json(capsys, finished.run_id, "--api-url", whitney.url)
    assert [g["label"] for g in student["groups"]] == [
        "eval-start",
        "cycle 0",
        "cycle 1",
        "cycle 2",
        "eval-end",
        "final",
    ]
    cycle_1 = student["groups"][2]
    assert [row["kind"] for row in cycle_1["operations"]] == [
        "save_weights_for_sampler",
        "sample",
        "sample",
        "sample",
        "forward_backward",
        "optim_step",
        "save_state",  # checkpoint_every=2: the state after cycle 1
    ]
    backward = cycle_1["operations"][4]
    assert set(backward["metrics"]) >= {"loss", "tokens:sum", "datums"}
    assert backward["usage"]["trained_tokens"] == cycle_1["usage"]["forward_backward"]["tokens"]
    assert sum(g["tokens"] for g in student["groups"]) == student["tokens"]
    teacher = inspect_json(capsys, finished.teacher_run_id, "--api-url", whitney.url)
    kinds = [row["kind"] for row in teacher["groups"][1]["operations"]]
    assert kinds == ["save_weights_for_sampler"] + ["logprobs"] * 3


@pytest.mark.usefixtures("wide_terminal")
def test_inspect_one_cycle_as_json_and_as_tables(
    finished: DistillationResult, whitney: EmbeddedWhitney, capsys: pytest.CaptureFixture[str]
) -> None:
    report = inspect_json(capsys, finished.run_id, "--cycle", "1", "--api-url", whitney.url)
    assert [group["cycle"] for group in report["groups"]] == [1]
    assert main(["inspect", finished.run_id, "--api-url", whitney.url]) == 0
    text = capsys.readouterr().out
    for label in ("eval-start", "cycle 0", "cycle 2", "final", "forward_backward", "sha256="):
        assert label in text
    for output in ([], ["--json"]):
        arguments = ["inspect", finished.run_id, "--cycle", "7", *output]
        assert main([*arguments, "--api-url", whitney.url]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (
            f"whitney-flows inspect: run {finished.run_id} has no cycle 7 (cycles: 0 to 2)\n"
        )
    assert main(["inspect", "run-nope", "--api-url", whitney.url]) == 1


def test_the_data_directory_gives_the_same_report_as_the_api(
    finished: DistillationResult, whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    from_api = run_report(ApiJournal(inspector), finished.run_id)
    from_disk = run_report(DataDirJournal(whitney.data_dir), finished.run_id)
    assert from_disk == from_api


@pytest.mark.usefixtures("wide_terminal")
def test_runs_lists_the_sessions_and_runs_with_their_status(
    finished: DistillationResult, whitney: EmbeddedWhitney, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--json", "--api-url", whitney.url]) == 0
    sessions = {s["session_id"]: s for s in json.loads(capsys.readouterr().out)["sessions"]}
    session = sessions[finished.session_id]
    assert session["status"] == "closed"
    runs = {run["run_id"]: run for run in session["runs"]}
    finished_run = runs[finished.run_id]
    assert runs[finished.run_id]["status"] == "finished"
    assert runs[finished.run_id]["trainable"] is True
    assert runs[finished.teacher_run_id]["trainable"] is False
    assert main(["runs", "--data-dir", str(whitney.data_dir)]) == 0
    table = capsys.readouterr().out
    assert finished.teacher_run_id in table
    (row,) = [line for line in table.splitlines() if finished.session_id in line]
    assert created_text(session["created_at"]) in row
    assert f" {finished_run['base_model']} " in row and "local/local/" not in table


def test_runs_lists_the_newest_first(
    finished: DistillationResult,
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    newer = inspector.close_session(inspector.open_session().session_id)
    assert main(["runs", "--json", "--data-dir", str(whitney.data_dir)]) == 0
    sessions = json.loads(capsys.readouterr().out)["sessions"]
    assert sessions[0]["session_id"] == newer.session_id
    assert finished.session_id in [session["session_id"] for session in sessions[1:]]
    created = [session["created_at"] for session in sessions]
    assert created == sorted(created, reverse=True)
    for session in sessions:
        runs = [run["created_at"] for run in session["runs"]]
        assert runs == sorted(runs, reverse=True)


@pytest.mark.parametrize(
    "arguments", [["inspect", "{run}"], ["inspect", "{run}", "--json"], ["runs"]]
)
def test_a_closed_pipe_ends_the_command_without_a_traceback(
    arguments: list[str], finished: DistillationResult, whitney: EmbeddedWhitney
) -> None:
    command = [argument.replace("{run}", finished.run_id) for argument in arguments]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WHITNEY_API_")}
    process = subprocess.Popen(
        [str(CONSOLE_SCRIPT), *command, "--data-dir", str(whitney.data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
    )
    process.stdout.close()  # the reader is gone before the first line (like `| head -0`)
    error = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1  # as rich's Console exits on a closed pipe
    assert error == ""


def test_piped_at_80_columns_each_operation_keeps_its_metrics_readable(
    finished: DistillationResult, whitney: EmbeddedWhitney, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inspect RUN | less` (rich's 80 columns): a table would squeeze the metrics column to a
    character or two per line; each operation's row is followed by its metrics, whole words,
    on lines of at most 80 characters."""
    report = inspect_json(capsys, finished.run_id, "--api-url", whitney.url)
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("WHITNEY_API_") and k != "COLUMNS"
    }
    printed = subprocess.run(
        [str(CONSOLE_SCRIPT), "inspect", finished.run_id, "--data-dir", str(whitney.data_dir)],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
        timeout=60,
    ).stdout
    lines = printed.splitlines()
    assert lines[0].startswith(f"run {finished.run_id} ")  # the run's one line, unwrapped
    assert all(len(line) <= 80 for line in lines[1:]), printed
    rows = [row for group in report["groups"] for row in group["operations"]]
    assert any(row["metrics"] for row in rows)
    for row in rows:
        (at,) = [
            i
            for i, line in enumerate(lines)
            if re.match(rf"^ *{row['seq_id']}  {row['kind']}", line)
        ]
        assert row["status"] in lines[at]
        below = []
        for line in lines[at + 1 :]:
            if not line.startswith("      "):
                break
            below.append(line.strip())
        words = " ".join(below).split()
        assert len(words) == len(row["metrics"])
        assert [word.split("=", 1)[0] for word in words] == list(row["metrics"])
