"""The journal and the executor's deterministic names and seeds, without HTTP."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from whitney.local.execution import default_sampler_id, default_seed, default_state_name
from whitney.local.journal import Journal, canonical_hash, operation_dict, render_operation


def journal_with_run(tmp_path: Path, session_labels: dict[str, str]) -> Journal:
    """A new journal holding session `sess-1` (with these labels) and its ready run `run-1`."""
    journal = Journal(tmp_path / "j.sqlite3")
    journal.insert_session("sess-1", "tenant", session_labels, lease_expires_at=None)
    journal.insert_run(
        {
            "run_id": "run-1",
            "tenant": "tenant",
            "session_id": "sess-1",
            "provider": "local",
            "base_model": "local/nano",
            "lora_rank": 8,
            "seed": 0,
            "role": "policy",
            "trainable": True,
            "from_checkpoint": None,
            "labels": {},
            "status": "ready",
        }
    )
    return journal


def test_canonical_hash_ignores_key_order_only():
    a = {"data": [{"x": 1, "y": [1.0, 2.0]}], "loss_function": "ppo"}
    b = {"loss_function": "ppo", "data": [{"y": [1.0, 2.0], "x": 1}]}
    assert canonical_hash(a) == canonical_hash(b)
    assert canonical_hash(a) != canonical_hash({**a, "loss_function": "cispo"})


def test_default_seeds_and_names_are_deterministic_across_processes():
    here = [default_seed(0, seq) for seq in range(1, 6)]
    code = (
        "from whitney.local.execution import default_seed\n"
        "print([default_seed(0, s) for s in range(1, 6)])"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(there) == here
    assert len(set(here)) == 5 and all(0 <= s < 2**63 for s in here)
    assert default_seed(1, 1) != default_seed(0, 1)
    assert default_sampler_id(7) == "sampler-7"
    assert default_state_name(7) == "seq-7"


def test_journal_rows_render_as_the_wire_operation(tmp_path):
    journal = journal_with_run(tmp_path, {"a": "b"})
    journal.insert_operation("run-1", 1, "forward", None, "h", '{"x":1}')
    journal.insert_operation("run-1", 2, "sample", 's"1', "h", "{}")
    journal.mark_running("run-1", [1])
    journal.finish_operation(
        "run-1", 1, "succeeded", result={"loss": -0.25, "v": [1.5]}, usage={"tokens": 3}
    )
    first = operation_dict(journal.get_operation("run-1", 1))
    assert first["status"] == "succeeded" and first["usage"] == {"tokens": 3}
    assert first["result"] == {"loss": -0.25, "v": [1.5]}  # NaN: tests/local/test_non_finite.py
    second = json.loads(render_operation(journal.get_operation("run-1", 2)))
    assert second["sampler_id"] == 's"1' and second["status"] == "pending"
    assert second["result"] is None and second["usage"] == {}
    assert journal.get_run("run-1")["next_seq_id"] == 3

    reader = Journal(tmp_path / "j.sqlite3", read_only=True)  # beside the writer
    assert [s["session_id"] for s in reader.every_session()] == ["sess-1"]
    assert reader.payloads("run-1", "forward") == {1: {"x": 1}}
    assert [row["seq_id"] for row in reader.list_operations("run-1", 0, 10)] == [1, 2]
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.close_session("sess-1", "a reader writes nothing")
    reader.close()
    journal.close()


def test_a_restart_requeues_what_was_running_and_keeps_what_committed(tmp_path):
    journal = journal_with_run(tmp_path, {})
    for seq in (1, 2, 3):
        journal.insert_operation("run-1", seq, "save_state", None, "h", f'{{"name":"c{seq}"}}')
    journal.mark_running("run-1", [1])
    journal.insert_checkpoint("run-1", "c1", 1, 0, "/states/c1")
    journal.finish_operation("run-1", 1, "succeeded", result={"step": 0})
    journal.mark_running("run-1", [2])
    journal.insert_checkpoint("run-1", "c2", 2, 0, "/states/c2")
    artifact = {"tenant": "tenant", "run_id": "run-1", "seq_id": 2, "format": "peft"}
    journal.insert_artifact(
        artifact | {"artifact_id": "a", "path": "/a.tar", "sha256": "", "bytes": 0}
    )
    # then the process died

    assert [run["run_id"] for run in journal.active_runs()] == ["run-1"]
    assert journal.requeue_interrupted("run-1") == ["/a.tar"]
    assert journal.get_artifact("a") is None
    rows = {row["seq_id"]: row for row in journal.replay_rows("run-1")}
    assert [rows[seq]["status"] for seq in (1, 2, 3)] == ["succeeded", "pending", "pending"]
    counts = [tuple(journal.get_operation("run-1", seq))[8] for seq in (1, 2, 3)]
    assert counts == [1, 0, 0]  # executions: the interrupted one does not count
    interrupted = journal._one("SELECT interrupted FROM operations WHERE seq_id=2")[0]
    assert interrupted == 1
    assert journal.get_checkpoint("run-1", "c1") is not None
    assert journal.get_checkpoint("run-1", "c2") is None  # written before a result that never was

    error = {"type": "internal", "message": "gone", "details": {}}
    journal.end_unrecoverable("run-1", "failed", error)
    assert journal.get_run("run-1")["status"] == "failed"
    assert journal.get_run("run-1")["error"] == error
    assert operation_dict(journal.get_operation("run-1", 3))["status"] == "cancelled"
    assert operation_dict(journal.get_operation("run-1", 1))["status"] == "succeeded"
    assert journal.active_runs() == []
    journal.close()


def test_a_journal_from_before_leases_opens_with_their_columns_added(tmp_path):
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as old:
        old.execute(
            "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL,"
            " status TEXT NOT NULL, labels TEXT NOT NULL, created_at TEXT NOT NULL,"
            " closed_at TEXT)"
        )
        old.execute(
            "INSERT INTO sessions VALUES ('sess-old', 't', 'open', '{}', '2026-11-30T00:00:00Z',"
            " NULL)"
        )
    journal = Journal(path)
    session = journal.get_session("sess-old")
    assert session is not None
    assert (session["lease_expires_at"], session["closed_reason"]) == (None, None)
    assert journal.renew_lease("sess-old", 1_800_000_000.0)
    assert journal.get_session("sess-old")["lease_expires_at"] == "2027-01-15T08:00:00.000000Z"
    assert journal.expired_sessions(1_800_000_001.0) == ["sess-old"]
    journal.close_session("sess-old", "closed by the client")
    assert journal.get_session("sess-old")["closed_reason"] == "closed by the client"
    assert not journal.renew_lease("sess-old", 1_900_000_000.0)
    journal.close()
