"""The server survives its own restart: a run it had active is rebuilt from its journal
(`whitney.local.recovery`) and goes on bit for bit as a run that was never interrupted.

The SIGKILL tests kill a real `serve` process (no handler runs, nothing is flushed) and start
it again on the same port and data directory; the others restart an in-process server."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from whitney.local import EmbeddedWhitney, recovery

from .helpers import (
    adamw,
    assert_error,
    datum,
    forward,
    http,
    new_run,
    post_op,
    run_op,
    sample_request,
)
from .served import ServedWhitney, served

CE = forward([datum([1, 2, 3], [4, 5, 6]), datum([7, 8], [9, 10, 11, 12])], "cross_entropy")
TEXT = {"sequences": [{"token_ids": [1, 2, 3, 4, 5, 6]}]}
Op = tuple[str, dict[str, Any], str | None]
SCRIPT: list[Op] = [
    ("forward_backward", CE, None),  # 1
    ("optim_step", adamw(1e-2), None),
    ("save_weights_for_sampler", {"name": "s1"}, None),
    ("sample", sample_request([1, 2], 4, 12, temperature=1.0), "s1"),
    ("forward_backward", CE, None),  # 5
    ("optim_step", adamw(1e-2), None),
    ("save_state", {"name": "c1"}, None),  # 7: the base of the rebuild
    ("forward_backward", CE, None),  # 8: a gradient pending when the server dies
    ("save_weights_for_sampler", {"name": "s2"}, None),  # 9: never sent before the kill
    ("optim_step", adamw(1e-2), None),  # 10, 11: queued behind the gap at 9
    ("save_weights_for_sampler", {"name": "s3"}, None),
    ("sample", sample_request([1, 2], 4, 12, temperature=1.0), "s3"),
    ("logprobs", TEXT, "s1"),  # a sampler from before the base: read back from disk
    ("logprobs", TEXT, "s2"),
    ("export_lora", {}, None),  # 15
]
SENT_BEFORE_KILL = 8
QUEUED = (10, 11)
REBUILT = re.compile(
    r"run (\S+) rebuilt after the restart in [\d.]+ s \(from (.+?), (\d+) operations replayed, "
    r"(\d+) queued again\)"
)


def terminal(api: httpx.Client, run_id: str, seq_id: int) -> dict[str, Any]:
    """The operation once terminal, waiting through the 503s of a rebuild."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        response = api.get(f"/v1/training/runs/{run_id}/operations/{seq_id}?wait_s=30")
        if response.status_code == 503:
            time.sleep(float(response.headers["Retry-After"]))
            continue
        assert response.status_code == 200, response.text
        if response.json()["status"] in ("succeeded", "failed", "cancelled"):
            return response.json()
    raise AssertionError(f"operation {seq_id} of run {run_id} never ended")


def post_until_killed(server: ServedWhitney, run_id: str, seq_id: int, *op: Any) -> None:
    """Submit an operation whose answer the server's death may cut short."""
    with server.client() as api, contextlib.suppress(httpx.TransportError):
        post_op(api, run_id, seq_id, *op)


def operation_status(api: httpx.Client, run_id: str, seq_id: int) -> str:
    response = api.get(f"/v1/training/runs/{run_id}/operations/{seq_id}")
    return response.json()["status"] if response.status_code == 200 else "missing"


def drive(api: httpx.Client, run_id: str, ops: list[Op], start: int = 1) -> dict[int, Any]:
    """Submit `ops` at seq ids from `start`, each once it may (503: rebuilding), and wait for
    each to succeed; their results by seq id."""
    results = {}
    for seq_id, (kind, payload, sampler) in enumerate(ops, start):
        response = post_op(api, run_id, seq_id, kind, payload, sampler)
        while response.status_code == 503:
            time.sleep(float(response.headers["Retry-After"]))
            response = post_op(api, run_id, seq_id, kind, payload, sampler)
        assert response.status_code == 200, response.text
        operation = terminal(api, run_id, seq_id)
        assert operation["status"] == "succeeded", operation
        results[seq_id] = operation["result"]
    return results


def journal(data_dir: Path, run_id: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(data_dir / "journal.sqlite3")
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(
            "SELECT * FROM operations WHERE run_id=? ORDER BY seq_id", (run_id,)
        ).fetchall()
    finally:
        conn.close()


def data_dir(server: ServedWhitney) -> Path:
    return Path(server.argv[server.argv.index("--data-dir") + 1])


def without_ids(results: dict[int, Any]) -> str:
    """The results as JSON with run and artifact ids (random) masked."""
    return re.sub(r"(run|art)-[0-9a-f]{16}", r"\1-ID", json.dumps(results, sort_keys=True))


def test_a_run_killed_with_a_gradient_pending_and_operations_queued_goes_on_bit_for_bit(
    tmp_path: Path,
) -> None:
    with served(tmp_path, "--session-ttl-s", "0") as server:
        with server.client() as api:
            reference = new_run(api, seed=5)["run_id"]
            expected = drive(api, reference, SCRIPT)
            assert api.post(f"/v1/training/runs/{reference}/finish").status_code == 200
            run_id = new_run(api, seed=5)["run_id"]
            before = drive(api, run_id, SCRIPT[:SENT_BEFORE_KILL])
            for seq_id in QUEUED:
                kind, payload, sampler = SCRIPT[seq_id - 1]
                assert post_op(api, run_id, seq_id, kind, payload, sampler).status_code == 200
        server.kill()
        server.restart()
        with server.client() as api:
            after = drive(api, run_id, SCRIPT[SENT_BEFORE_KILL:], SENT_BEFORE_KILL + 1)
    assert without_ids(before | after) == without_ids(expected)
    (rebuilt,) = REBUILT.findall(server.log.read_text())
    assert rebuilt == (run_id, "its checkpoint at seq_id 7", "1", str(len(QUEUED)))
    rows = journal(data_dir(server), run_id)
    assert [row["executions"] for row in rows] == [1] * len(SCRIPT)
    assert [row["interrupted"] for row in rows] == [0] * len(SCRIPT)


def test_an_operation_running_when_the_server_died_runs_again_once(tmp_path: Path) -> None:
    long_sample = sample_request([1, 2, 3], 8, 128, temperature=1.0)
    with served(tmp_path, "--session-ttl-s", "0") as server:
        with server.client() as api:
            reference = new_run(api, seed=7)["run_id"]
            run_op(api, reference, 1, "save_weights_for_sampler", {"name": "s"})
            expected = run_op(api, reference, 2, "sample", long_sample, "s")["result"]
            run_id = new_run(api, seed=7)["run_id"]
            run_op(api, run_id, 1, "save_weights_for_sampler", {"name": "s"})
            submit = threading.Thread(  # its POST waits for the answer up to post_wait_s
                target=post_until_killed, args=(server, run_id, 2, "sample", long_sample, "s")
            )
            submit.start()
            while (status := operation_status(api, run_id, 2)) != "running":
                assert status in ("missing", "pending"), status
                time.sleep(0.01)
        server.kill()
        submit.join()
        server.restart()
        with server.client() as api:
            assert terminal(api, run_id, 2)["result"] == expected
    (row, sample) = journal(data_dir(server), run_id)
    assert (sample["executions"], sample["interrupted"]) == (1, 1)
    assert (row["executions"], row["interrupted"]) == (1, 0)


def test_a_journal_that_does_not_replay_fails_the_run_with_a_clear_error(tmp_path: Path) -> None:
    with served(tmp_path, "--session-ttl-s", "0") as server:
        with server.client() as api:
            run_id = new_run(api)["run_id"]
            drive(api, run_id, SCRIPT[:3])
        server.kill()
        path = data_dir(server) / "journal.sqlite3"
        with sqlite3.connect(path) as conn:
            (text,) = conn.execute(
                "SELECT result FROM operations WHERE run_id=? AND seq_id=1", (run_id,)
            ).fetchone()
            result = json.loads(text)
            result["loss"] += 1.0  # the journal no longer says what the engine computes
            conn.execute(
                "UPDATE operations SET result=? WHERE run_id=? AND seq_id=1",
                (json.dumps(result, separators=(",", ":")), run_id),
            )
        server.restart()
        with server.client() as api:
            deadline = time.monotonic() + 60
            while (run := api.get(f"/v1/training/runs/{run_id}").json())["status"] == "ready":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert run["status"] == "failed"
            message = run["error"]["message"]
            assert "could not rebuild the run" in message
            assert "replaying forward_backward at seq_id 1" in message
            assert_error(post_op(api, run_id, 4, *SCRIPT[4][:2]), 409, "run_not_active")


@pytest.fixture
def slow_rebuild(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Rebuilds wait for this event (the server's behaviour while one takes its time)."""
    release = threading.Event()
    rebuild = recovery.rebuild

    def waiting(*args: Any, **kwargs: Any) -> recovery.Rebuilt:
        assert release.wait(60)
        return rebuild(*args, **kwargs)

    monkeypatch.setattr(recovery, "rebuild", waiting)
    return release


def test_a_run_being_rebuilt_answers_503_with_retry_after_and_its_journal(
    tmp_path: Path, slow_rebuild: threading.Event
) -> None:
    keys = ["rebuild-key"]
    with EmbeddedWhitney(tmp_path, api_keys=keys, session_ttl_s=0) as server, http(server) as api:
        run = new_run(api, seed=3)
        run_id, session_id = run["run_id"], run["session_id"]
        done = drive(api, run_id, SCRIPT[:3])
        assert post_op(api, run_id, 5, *SCRIPT[4][:2]).status_code == 200  # pending, gap at 4
    with EmbeddedWhitney(tmp_path, api_keys=keys, session_ttl_s=0) as server, http(server) as api:
        runs = f"/v1/training/runs/{run_id}"
        assert api.get(f"{runs}/operations/3").json()["result"] == done[3]
        assert post_op(api, run_id, 3, *SCRIPT[2][:2]).json()["result"] == done[3]
        for response in (
            post_op(api, run_id, 4, *SCRIPT[3]),
            api.get(f"{runs}/operations/5", params={"wait_s": 5}),
            api.post(f"{runs}/finish"),
            api.post(f"{runs}/cancel"),
        ):
            error = assert_error(response, 503, "unavailable", "being rebuilt")
            assert response.headers["Retry-After"] == "1"
            assert error["details"] == {"run_id": run_id}
        assert api.get(runs).json()["status"] == "ready"
        slow_rebuild.set()
        assert drive(api, run_id, SCRIPT[3:5], 4)[5] is not None

        # a session closed while its run is rebuilt: the run is cancelled once rebuilt
        slow_rebuild.clear()
    with EmbeddedWhitney(tmp_path, api_keys=keys, session_ttl_s=0) as server, http(server) as api:
        assert api.post(f"/v1/sessions/{session_id}/close").status_code == 200
        slow_rebuild.set()
        deadline = time.monotonic() + 60
        while api.get(runs).json()["status"] != "cancelled":
            assert time.monotonic() < deadline, api.get(runs).json()
            time.sleep(0.05)


def test_runs_left_cancelling_or_allocating_end_at_the_restart(tmp_path: Path) -> None:
    keys = ["leftover-key"]
    with EmbeddedWhitney(tmp_path, api_keys=keys, session_ttl_s=0) as server, http(server) as api:
        cancelling, allocating = (new_run(api)["run_id"] for _ in "ab")
        assert post_op(api, cancelling, 2, *SCRIPT[1][:2]).status_code == 200  # pending
    with sqlite3.connect(tmp_path / "journal.sqlite3") as conn:
        for run_id, status in ((cancelling, "cancelling"), (allocating, "allocating")):
            conn.execute("UPDATE runs SET status=? WHERE run_id=?", (status, run_id))
    with EmbeddedWhitney(tmp_path, api_keys=keys, session_ttl_s=0) as server, http(server) as api:
        ended = api.get(f"/v1/training/runs/{cancelling}").json()
        assert ended["status"] == "cancelled"
        pending = api.get(f"/v1/training/runs/{cancelling}/operations/2").json()
        assert pending["status"] == "cancelled"
        assert "being cancelled when the server restarted" in pending["error"]["message"]
        failed = api.get(f"/v1/training/runs/{allocating}").json()
        assert failed["status"] == "failed"
        assert "while the run was being allocated" in failed["error"]["message"]


def row(seq_id: int, kind: str, name: str | None = None, status: str = "succeeded") -> dict:
    payload = {} if name is None else {"name": name}
    return {"seq_id": seq_id, "kind": kind, "status": status, "payload": json.dumps(payload)}


def test_the_base_is_the_latest_checkpoint_with_no_gradient_pending_and_samplers_on_disk() -> None:
    always = lambda _: True  # noqa: E731
    rows = [
        row(1, "forward_backward"),
        row(2, "optim_step"),
        row(3, "save_state", "a"),
        row(4, "forward_backward"),
        row(5, "save_state", "b"),  # a gradient pending: not a base
        row(6, "optim_step"),
        row(7, "save_weights_for_sampler"),
        row(8, "save_state", status="failed"),
    ]
    assert recovery.replay_base(rows, always, always) == 3
    assert recovery.replay_base([*rows, row(9, "save_state")], always, always) == 9
    on_disk = lambda name: name != "sampler-7"  # noqa: E731
    assert recovery.replay_base([*rows, row(9, "save_state")], on_disk, always) == 3
    assert recovery.replay_base(rows, always, lambda name: name != "a") is None
    assert (
        recovery.replay_base(
            [*rows[:4], row(5, "load_state"), row(6, "save_state")], always, always
        )
        == 6
    )
