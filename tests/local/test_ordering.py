"""Exactly-once and ordering over HTTP: replays, shuffled concurrent submission, seq_conflict,
seq_gap, sampler snapshots, checkpoints, overlap of runs, and a restart of the server."""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from whitney.errors import OperationFailed, SeqConflict
from whitney.local import EmbeddedWhitney

from .helpers import (
    adamw,
    assert_error,
    datum,
    forward,
    http,
    journal_rows,
    new_run,
    post_op,
    run_op,
    sample_request,
    wait_op,
)

TEXT = list(b"the cat sat on the mat")
CE = forward([datum(TEXT[:4], TEXT[4:])], "cross_entropy")


def rl_payload() -> dict:
    completion = TEXT[4:12]
    return forward(
        [
            datum(
                TEXT[:4],
                completion,
                logprobs=[-5.5] * len(completion),
                advantages=[1.0, -0.5, 0.25, 1.0, -1.0, 0.5, 0.75, -0.25],
            ),
            datum(TEXT[:2], TEXT[2:6], logprobs=[-5.0] * 4, advantages=[-1.0] * 4),
        ],
        "ppo",
    )


def script() -> list[tuple[str, dict, str | None]]:
    """A run's operations, sampler ids by name so any of them can be sent first."""
    ops: list[tuple[str, dict, str | None]] = []
    for cycle in range(3):
        ops.append(("save_weights_for_sampler", {"name": f"c{cycle}"}, None))
        ops.append(("sample", sample_request(TEXT[:3], 4, 8), f"c{cycle}"))
        ops.append(("sample", sample_request(TEXT[:5], 2, 6, seed=1234), f"c{cycle}"))
        ops.append(("forward_backward", rl_payload(), None))
        ops.append(("optim_step", adamw(2e-2), None))
    ops.append(("logprobs", {"sequences": [{"token_ids": TEXT}]}, "c2"))
    ops.append(("save_state", {"name": "end"}, None))
    ops.append(("export_lora", {}, None))
    return ops


def comparable(op: dict) -> dict:
    """An operation's outcome without what names the run (ids, URIs, timestamps)."""
    result = dict(op["result"] or {})
    result.pop("artifact_id", None)
    if "checkpoint" in result:
        result["checkpoint"] = result["checkpoint"].rsplit("/", 1)[-1]
    return {
        "kind": op["kind"],
        "status": op["status"],
        "result": result,
        "usage": op["usage"],
        "sampler_id": op["sampler_id"],
    }


def test_resending_every_operation_returns_the_stored_results(embedded_server):
    with http(embedded_server) as api:
        run_id = new_run(api, seed=21)["run_id"]
        ops = script()
        first = [
            run_op(api, run_id, seq, kind, payload, sampler)
            for seq, (kind, payload, sampler) in enumerate(ops, start=1)
        ]
        second = [
            post_op(api, run_id, seq, kind, payload, sampler).json()
            for seq, (kind, payload, sampler) in enumerate(ops, start=1)
        ]
        assert second == first  # identical, timestamps included: nothing ran again
        rows = journal_rows(embedded_server, run_id)
        assert [row["seq_id"] for row in rows] == list(range(1, len(ops) + 1))
        assert all(row["executions"] == 1 for row in rows)
        assert all(row["status"] == "succeeded" for row in rows)
        listing = api.get(f"/v1/training/runs/{run_id}/operations").json()["operations"]
        assert [op["seq_id"] for op in listing] == list(range(1, len(ops) + 1))


def test_shuffled_concurrent_submission_equals_in_order(embedded_server):
    ops = script()
    with http(embedded_server) as api:
        in_order = new_run(api, seed=5)["run_id"]
        expected = [
            run_op(api, in_order, seq, kind, payload, sampler)
            for seq, (kind, payload, sampler) in enumerate(ops, start=1)
        ]
        shuffled = new_run(api, seed=5)["run_id"]
    order = list(enumerate(ops, start=1))
    random.Random(3).shuffle(order)

    local = threading.local()

    def submit(item):
        seq, (kind, payload, sampler) = item
        if not hasattr(local, "client"):
            local.client = http(embedded_server)
        response = post_op(local.client, shuffled, seq, kind, payload, sampler)
        assert response.status_code == 200, response.text
        return seq

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert sorted(pool.map(submit, order)) == list(range(1, len(ops) + 1))
    with http(embedded_server) as api:
        got = [wait_op(api, shuffled, seq) for seq in range(1, len(ops) + 1)]
    assert [comparable(op) for op in got] == [comparable(op) for op in expected]
    assert got[-1]["result"]["sha256"] == expected[-1]["result"]["sha256"]
    # each once; run operations strictly in seq_id order, each sampler operation after the
    # save_weights_for_sampler that published its sampler
    rows = journal_rows(embedded_server, shuffled)
    assert all(row["executions"] == 1 for row in rows)
    training = [row for row in rows if row["kind"] not in ("sample", "logprobs")]
    starts = [row["started_at"] for row in training]
    assert starts == sorted(starts)
    published = {
        json.loads(row["payload"])["name"]: row["finished_at"]
        for row in training
        if row["kind"] == "save_weights_for_sampler"
    }
    for row in rows:
        if row["kind"] in ("sample", "logprobs"):
            assert row["started_at"] >= published[row["sampler_id"]], row["seq_id"]


def test_seq_conflict(embedded_server, whitney_client):
    with http(embedded_server) as api:
        run_id = new_run(api)["run_id"]
        run_op(api, run_id, 1, "save_weights_for_sampler", {"name": "s"})
        run_op(api, run_id, 2, "forward", CE)
        other = forward([datum(TEXT[:3], TEXT[3:9])], "cross_entropy")
        error = assert_error(post_op(api, run_id, 2, "forward", other), 409, "seq_conflict")
        assert error["details"]["seq_id"] == 2
        assert_error(post_op(api, run_id, 2, "forward_backward", CE), 409, "seq_conflict")
        assert_error(post_op(api, run_id, 1, "save_weights_for_sampler", {}), 409, "seq_conflict")
        logprobs = {"sequences": [{"token_ids": TEXT[:5]}]}
        run_op(api, run_id, 3, "logprobs", logprobs, "s")
        assert_error(post_op(api, run_id, 3, "logprobs", logprobs, "t"), 409, "seq_conflict")
        # the canonical form: key order does not matter
        reordered = {"loss_config": {}, "loss_function": "cross_entropy", "data": CE["data"]}
        assert post_op(api, run_id, 2, "forward", reordered).json()["status"] == "succeeded"
    with pytest.raises(SeqConflict):
        whitney_client.execute(run_id, "forward", other, seq_id=2)


def test_seq_gap_fails_the_waiting_operation_after_the_timeout():
    with EmbeddedWhitney(gap_timeout_s=0.3, post_wait_s=0.05) as server, http(server) as api:
        run_id = new_run(api)["run_id"]
        ahead = post_op(api, run_id, 2, "forward", CE).json()
        assert ahead["status"] == "pending"
        failed = wait_op(api, run_id, 2)
        assert failed["status"] == "failed"
        assert failed["error"]["type"] == "seq_gap"
        assert "seq_id 1" in failed["error"]["message"]
        assert failed["error"]["details"] == {"seq_id": 2, "missing_seq_id": 1}
        # the gap fills later: 1 runs, 2 stays failed (never runs), 3 runs
        assert run_op(api, run_id, 1, "forward", CE)["status"] == "succeeded"
        assert run_op(api, run_id, 3, "forward", CE)["status"] == "succeeded"
        assert post_op(api, run_id, 2, "forward", CE).json() == failed
        assert [row["executions"] for row in journal_rows(server, run_id)] == [1, 0, 1]

        from whitney.client import WhitneyClient

        with WhitneyClient(server.url, server.api_key) as client:
            with pytest.raises(OperationFailed) as raised:
                client.execute(run_id, "forward", CE, seq_id=5)
            assert raised.value.type == "seq_gap"


def test_sampler_snapshots_are_isolated_from_later_training(embedded_server):
    with http(embedded_server) as api:
        run_id = new_run(api, seed=9)["run_id"]
        probe = {"sequences": [{"token_ids": TEXT}, {"token_ids": TEXT[:7]}]}
        seeded = sample_request(TEXT[:3], 3, 10, seed=77)
        run_op(api, run_id, 1, "save_weights_for_sampler", {"name": "before"})
        before = run_op(api, run_id, 2, "logprobs", probe, "before")["result"]
        sampled = run_op(api, run_id, 3, "sample", seeded, "before")["result"]
        for seq in range(4, 10, 2):
            run_op(api, run_id, seq, "forward_backward", CE)
            run_op(api, run_id, seq + 1, "optim_step", adamw(5e-2))
        assert run_op(api, run_id, 10, "logprobs", probe, "before")["result"] == before
        assert run_op(api, run_id, 11, "sample", seeded, "before")["result"] == sampled
        run_op(api, run_id, 12, "save_weights_for_sampler", {"name": "after"})
        after = run_op(api, run_id, 13, "logprobs", probe, "after")["result"]
        assert after != before
        # trained on TEXT: the new snapshot likes it better
        assert sum(after["logprobs"][0][1:]) > sum(before["logprobs"][0][1:])


def test_save_state_then_load_state_and_from_checkpoint_reproduce_exactly(embedded_server):
    probe = {"sequences": [{"token_ids": TEXT}]}
    with http(embedded_server) as api:
        source = new_run(api, seed=4)
        run_id = source["run_id"]
        run_op(api, run_id, 1, "forward_backward", CE)
        run_op(api, run_id, 2, "optim_step", adamw(3e-2))
        run_op(api, run_id, 3, "forward_backward", rl_payload())
        run_op(api, run_id, 4, "optim_step", adamw(3e-2))
        checkpoint = run_op(api, run_id, 5, "save_state", {})["result"]
        assert checkpoint == {"checkpoint": f"whitney://runs/{run_id}/states/seq-5", "step": 2}
        run_op(api, run_id, 6, "save_weights_for_sampler", {"name": "s"})
        expected = run_op(api, run_id, 7, "logprobs", probe, "s")["result"]

        resumed = new_run(
            api, source["session_id"], seed=99, from_checkpoint=checkpoint["checkpoint"]
        )
        assert resumed["step"] == 2
        run_op(api, resumed["run_id"], 1, "save_weights_for_sampler", {"name": "s"})
        assert run_op(api, resumed["run_id"], 2, "logprobs", probe, "s")["result"] == expected

        fresh = new_run(api, source["session_id"], seed=123)["run_id"]
        loaded = run_op(api, fresh, 1, "load_state", {"checkpoint": checkpoint["checkpoint"]})
        assert loaded["result"] == {"step": 2}
        assert api.get(f"/v1/training/runs/{fresh}").json()["step"] == 2
        run_op(api, fresh, 2, "save_weights_for_sampler", {"name": "s"})
        assert run_op(api, fresh, 3, "logprobs", probe, "s")["result"] == expected

        # optimizer state came along: one more identical step gives identical adapters
        shas = []
        for rid, seq in ((run_id, 8), (resumed["run_id"], 3), (fresh, 4)):
            run_op(api, rid, seq, "forward_backward", CE)
            run_op(api, rid, seq + 1, "optim_step", adamw(3e-2))
            shas.append(run_op(api, rid, seq + 2, "export_lora", {})["result"]["sha256"])
        assert shas[0] == shas[1] == shas[2]

        missing = f"whitney://runs/{run_id}/states/nope"
        response = post_op(api, fresh, 7, "load_state", {"checkpoint": missing})
        assert_error(response, 404, "not_found", "payload.checkpoint")  # before journaling
        assert api.get(f"/v1/training/runs/{fresh}").json()["next_seq_id"] == 7
        assert_error(
            post_op(api, fresh, 7, "load_state", {"checkpoint": "/etc/passwd"}),
            400,
            "invalid_request",
            "checkpoint",
        )


def test_operations_of_different_runs_execute_concurrently(embedded_server):
    long_text = list(b"abcdefghijklmnopqrstuvwxyz" * 4)[:100]
    payload = forward([datum(long_text[:4], long_text[4:]) for _ in range(16)], "cross_entropy")
    with http(embedded_server) as api:
        runs = [new_run(api, base_model="local/tiny", seed=i)["run_id"] for i in range(2)]
    barrier = threading.Barrier(2)

    def drive(run_id: str) -> list[dict]:
        with http(embedded_server) as client:
            barrier.wait()
            return [run_op(client, run_id, seq, "forward", payload) for seq in range(1, 4)]

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(drive, runs))
    intervals = [[(op["started_at"], op["finished_at"]) for op in ops] for ops in results]
    overlaps = [(a, b) for a in intervals[0] for b in intervals[1] if a[0] < b[1] and b[0] < a[1]]
    assert overlaps, intervals


def test_a_restarted_server_keeps_its_journal_and_checkpoints(tmp_path):
    keys = ["restart-key"]
    with EmbeddedWhitney(tmp_path, api_keys=keys) as server, http(server) as api:
        run = new_run(api, seed=2)
        run_id = run["run_id"]
        run_op(api, run_id, 1, "forward_backward", CE)
        run_op(api, run_id, 2, "optim_step", adamw(1e-2))
        checkpoint = run_op(api, run_id, 3, "save_state", {"name": "keep"})["result"]["checkpoint"]
        run_op(api, run_id, 4, "save_weights_for_sampler", {"name": "s"})
        expected = run_op(api, run_id, 5, "logprobs", {"sequences": [{"token_ids": TEXT}]}, "s")
    assert (tmp_path / "journal.sqlite3").exists()
    assert (tmp_path / "runs" / run_id / "states" / "keep").is_dir()
    with EmbeddedWhitney(tmp_path, api_keys=keys) as server, http(server) as api:
        assert (
            wait_op(api, run_id, 5) == expected
        )  # the answer is the journal's, during the rebuild and after it
        assert api.get(f"/v1/training/runs/{run_id}").json()["status"] == "ready"
        again = run_op(api, run_id, 6, "logprobs", {"sequences": [{"token_ids": TEXT}]}, "s")
        assert again["result"] == expected["result"]  # the rebuilt sampler, bit for bit
        resumed = new_run(api, run["session_id"], from_checkpoint=checkpoint)
        run_op(api, resumed["run_id"], 1, "save_weights_for_sampler", {"name": "s"})
        again = run_op(
            api, resumed["run_id"], 2, "logprobs", {"sequences": [{"token_ids": TEXT}]}, "s"
        )
        assert again["result"] == expected["result"]
    assert tmp_path.exists()  # a given data dir is never removed


def test_embedded_server_starts_fast_and_stops_clean():
    before = {t.ident for t in threading.enumerate()}
    started = time.monotonic()
    server = EmbeddedWhitney().start()
    assert time.monotonic() - started < 2.0
    data_dir = server.data_dir
    with http(server) as api:
        assert api.get("/v1/training/capabilities").status_code == 200
    server.stop()
    assert not data_dir.exists()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        leaked = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        if not leaked:
            break
        time.sleep(0.05)
    assert not leaked, leaked
