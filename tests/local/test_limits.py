"""The server's limits and its checks before journaling, tried as an attacker would against a
real `serve` process: each request is refused with a 4xx naming the field (and the limit),
the run's next_seq_id does not move, the other tenant is still served, and the server's
resident memory stays small."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .helpers import (
    adamw,
    assert_error,
    datum,
    forward,
    new_run,
    post_op,
    sample_request,
    tensor,
)
from .served import ServedWhitney, served

RSS_BOUND_MB = 1500.0
"""A served local/nano server holds about 250 MiB; one over-limit request once took 10.7 GB."""
PENDING_LIMIT = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWhitney]:
    flags = ("--max-pending-operations", str(PENDING_LIMIT), "--gap-timeout-s", "120")
    with served(tmp_path_factory.mktemp("limits"), *flags) as running:
        yield running


@pytest.fixture(scope="module")
def api(server: ServedWhitney) -> Iterator[httpx.Client]:
    with server.client(0) as client:
        yield client


@pytest.fixture(scope="module")
def run_id(api: httpx.Client) -> str:
    """Tenant A's run, with the sampler `s0` of its initial weights (seq_id 1)."""
    run = new_run(api)["run_id"]
    post_op(api, run, 1, "save_weights_for_sampler", {"name": "s0"})
    return run


def next_seq_id(api: httpx.Client, run_id: str) -> int:
    return api.get(f"/v1/training/runs/{run_id}").json()["next_seq_id"]


def refused_before_journaling(
    server: ServedWhitney, api: httpx.Client, run_id: str, response: httpx.Response
) -> None:
    """Nothing was journaled, the other tenant is served, the server is small."""
    assert next_seq_id(api, run_id) == 2
    assert server.alive()
    with server.client(1) as other:
        assert other.get("/v1/sessions").status_code == 200
    assert server.rss_mb() < RSS_BOUND_MB, server.rss_mb()
    assert "Traceback" not in response.text


LONG = list(range(3, 1003))
"""1000 token ids: 17 such datums are over max_tokens_per_request (16384)."""


@pytest.mark.parametrize(
    ("kind", "payload", "sampler", "field", "limit"),
    [
        (
            "sample",
            sample_request([1, 2], 10**9, 4),
            "s0",
            "payload.num_samples",
            "max_num_samples",
        ),
        ("sample", sample_request([1, 2], 1, 10**9), "s0", "max_tokens", "max_tokens"),
        (
            "sample",
            sample_request([1, 2], 256, 100),
            "s0",
            "payload.num_samples",
            "max_tokens_per_request",
        ),
        (
            "forward_backward",
            forward([datum([1], [2])] * 1025, "cross_entropy"),
            None,
            "payload.data",
            "max_datums",
        ),
        (
            "forward_backward",
            forward([datum(LONG[:1], LONG[1:]) for _ in range(17)], "cross_entropy"),
            None,
            "payload.data",
            "max_tokens_per_request",
        ),
        (
            "forward_backward",
            forward([datum([1], list(range(2, 1100)))], "cross_entropy"),
            None,
            "payload.data[0].input.token_ids",
            "max_tokens_per_datum",
        ),
        (
            "logprobs",
            {"sequences": [{"token_ids": [1, 2]}] * 1025},
            "s0",
            "payload.sequences",
            "max_sequences",
        ),
    ],
)
def test_a_request_over_a_limit_is_refused_naming_the_field_and_the_limit(
    server: ServedWhitney,
    api: httpx.Client,
    run_id: str,
    kind: str,
    payload: dict[str, Any],
    sampler: str | None,
    field: str,
    limit: str,
) -> None:
    response = post_op(api, run_id, 2, kind, payload, sampler)
    error = assert_error(response, 422, "limit_exceeded", field, limit)
    assert error["details"]["limit"] == limit
    assert error["details"]["max"] == server_limits(api)[limit]
    refused_before_journaling(server, api, run_id, response)


def server_limits(api: httpx.Client) -> dict[str, int]:
    return api.get("/v1/training/capabilities").json()["limits"]


def test_a_seq_id_far_ahead_of_next_seq_id_is_refused(
    server: ServedWhitney, api: httpx.Client, run_id: str
) -> None:
    window = server_limits(api)["seq_window"]
    for seq_id in (2**63 - 1, 2 + window):
        response = post_op(api, run_id, seq_id, "optim_step", adamw())
        error = assert_error(response, 422, "limit_exceeded", "seq_id", "seq_window")
        assert error["details"]["max"] == 1 + window
        refused_before_journaling(server, api, run_id, response)


def bad_datum(**changes: Any) -> dict[str, Any]:
    base = datum([1, 2], [3, 4])
    base["loss_inputs"].update(changes)
    return base


@pytest.mark.parametrize(
    ("kind", "payload", "sampler", "status", "type_", "needles"),
    [
        (
            "forward_backward",
            forward([datum([1, 2], [3, 300])], "cross_entropy"),
            None,
            422,
            "invalid_datum",
            ["data[0]", "vocabulary"],
        ),
        (
            "forward_backward",
            forward([bad_datum(mask=tensor("float32", [1.0, 1.0, 1.0]))], "cross_entropy"),
            None,
            422,
            "invalid_datum",
            ["data[0].loss_inputs.mask", "known"],
        ),
        ("sample", sample_request([1, 999], 1, 4), "s0", 400, "invalid_request", ["prompt"]),
        ("sample", sample_request([1, 2], 1, 4), "nope", 404, "not_found", ["sampler", "nope"]),
        (
            "logprobs",
            {"sequences": [{"token_ids": [1, 70000]}]},
            "s0",
            400,
            "invalid_request",
            ["sequences[0]"],
        ),
        (
            "load_state",
            {"checkpoint": "whitney://runs/run-0000000000000000/states/x"},
            None,
            404,
            "not_found",
            ["payload.checkpoint"],
        ),
        (
            "optim_step",
            adamw(1e308),
            None,
            400,
            "invalid_request",
            ["optimizer.learning_rate"],
        ),
        (
            "sample",
            sample_request([1, 2], 1, 4, temperature=1e-300),
            "s0",
            400,
            "invalid_request",
            ["temperature"],
        ),
    ],
)
def test_what_can_be_checked_without_running_is_refused_before_journaling(
    server: ServedWhitney,
    api: httpx.Client,
    run_id: str,
    kind: str,
    payload: dict[str, Any],
    sampler: str | None,
    status: int,
    type_: str,
    needles: list[str],
) -> None:
    response = post_op(api, run_id, 2, kind, payload, sampler)
    error = assert_error(response, status, type_, *needles)
    assert error["details"].get("field") or error["details"].get("tensor"), error
    refused_before_journaling(server, api, run_id, response)


def test_a_body_over_max_body_bytes_is_refused_unread(
    server: ServedWhitney, api: httpx.Client, run_id: str
) -> None:
    """A forward_backward of 100k datums (12 MB; it once peaked at 10.6 GB), and a 9 MB label
    (a 200 MB one was stored and journaled): 413 before a byte is parsed or stored."""
    sessions = len(api.get("/v1/sessions").json()["sessions"])
    datums = forward([datum([1], [2])] * 100_000, "cross_entropy")
    response = post_op(api, run_id, 2, "forward_backward", datums)
    error = assert_error(response, 413, "payload_too_large", "max_body_bytes")
    assert error["details"]["limit"] == "max_body_bytes"
    refused_before_journaling(server, api, run_id, response)
    label = {"labels": {"big": "x" * (9 * 1024 * 1024)}}
    response = api.post("/v1/sessions", json=label)
    assert_error(response, 413, "payload_too_large", "max_body_bytes")
    assert len(api.get("/v1/sessions").json()["sessions"]) == sessions
    refused_before_journaling(server, api, run_id, response)


def test_labels_over_the_limits_are_refused(server: ServedWhitney, api: httpx.Client) -> None:
    sessions = len(api.get("/v1/sessions").json()["sessions"])
    many = {f"k{i}": "v" for i in range(33)}
    assert_error(api.post("/v1/sessions", json={"labels": many}), 422, "limit_exceeded", "labels")
    long = {"k": "v" * 257}
    error = assert_error(
        api.post("/v1/sessions", json={"labels": long}), 422, "limit_exceeded", "labels.k"
    )
    assert error["details"]["limit"] == "max_label_chars"
    assert len(api.get("/v1/sessions").json()["sessions"]) == sessions
    session_id = api.post("/v1/sessions", json={}).json()["session_id"]
    body = {"session_id": session_id, "provider": "local", "base_model": "local/nano"}
    response = api.post("/v1/training/runs", json=body | {"labels": many})
    assert_error(response, 422, "limit_exceeded", "labels")
    assert api.get(f"/v1/sessions/{session_id}").json()["run_ids"] == []


def test_a_run_holds_at_most_max_pending_operations(
    server: ServedWhitney, api: httpx.Client
) -> None:
    run = new_run(api)["run_id"]
    for seq_id in range(2, 2 + PENDING_LIMIT):  # seq_id 1 missing: all of them wait
        assert post_op(api, run, seq_id, "optim_step", adamw()).status_code == 200
    response = post_op(api, run, 2 + PENDING_LIMIT, "optim_step", adamw())
    error = assert_error(response, 429, "rate_limited", "max_pending_operations")
    assert error["details"]["limit"] == "max_pending_operations"
    assert float(response.headers["Retry-After"]) > 0
    assert next_seq_id(api, run) == 2 + PENDING_LIMIT
    assert api.post(f"/v1/training/runs/{run}/cancel").status_code == 200


def test_the_capabilities_state_the_limits_the_server_was_started_with(
    api: httpx.Client,
) -> None:
    limits = server_limits(api)
    assert limits["max_pending_operations"] == PENDING_LIMIT
    assert limits["max_num_samples"] == 256 and limits["max_body_bytes"] == 8 * 1024 * 1024
