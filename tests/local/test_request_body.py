"""Request bodies that cannot be a request are refused before anything is stored: over
`max_body_bytes` is 413 (from Content-Length, or counted while streaming); bytes that are not
UTF-8 or not JSON, a lone surrogate, nesting past 64 or an absurd integer literal are 400
naming the body or the field; NaN and Infinity literals are refused by the strict models,
naming their field. The run's `next_seq_id` does not move and the other tenant is served."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from .helpers import assert_error, new_run

JSON = {"content-type": "application/json"}

BAD_BODIES: dict[str, tuple[bytes, str, str]] = {
    "invalid UTF-8": (b'{"labels": {"a": "\xff\xfe"}}', "body", "not UTF-8"),
    "a lone surrogate in a value": (b'{"labels": {"a": "x\\ud800"}}', "labels.a", "surrogate"),
    "a lone surrogate in a key": (b'{"labels": {"\\udfff": "x"}}', "labels", "surrogate"),
    "a reversed surrogate pair": (b'{"labels": {"a": "\\ude00\\ud83d"}}', "labels.a", "surrogate"),
    "100k-deep nesting": (b"[" * 100_000 + b"]" * 100_000, "body", "nest deeper than 64"),
    "100k unclosed brackets": (b'{"labels": ' + b"[" * 100_000, "body", "nest deeper than 64"),
    "nesting 65 deep": (b'{"labels": ' + b"[" * 64 + b"]" * 64 + b"}", "body", "nest deeper"),
    "a 5000-digit integer": (b'{"seq_id": ' + b"9" * 5000 + b"}", "body", "longer than any"),
    "not JSON": (b'{"labels": ', "body", "invalid JSON"),
}


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400"]
SAMPLE = '{"prompt": {"token_ids": [1]}, "sampling_params": {"max_tokens": 1, "temperature": %s}}'
NON_FINITE_OPERATIONS: dict[str, tuple[str, str]] = {
    "seq_id": ('{"seq_id": %s, "kind": "save_state"}', "seq_id"),
    "an unknown field": ('{"seq_id": 1, "kind": "save_state", "x": %s}', "x"),
    "a payload float": (
        '{"seq_id": 1, "kind": "optim_step", "payload": {"optimizer": {"learning_rate": %s}}}',
        "payload.optimizer.learning_rate",
    ),
    "a loss_config value": (
        '{"seq_id": 1, "kind": "forward", "payload": {"data": [{"input": {"token_ids": [1]}, '
        '"loss_inputs": {}}], "loss_function": "cross_entropy", "loss_config": {"c": %s}}}',
        "payload.loss_config.c",
    ),
    "a sampler float": (
        '{"seq_id": 1, "kind": "sample", "payload": ' + SAMPLE + "}",
        "payload.sampling_params.temperature",
    ),
}


def limits(api: httpx.Client) -> dict[str, int]:
    return api.get("/v1/training/capabilities").json()["limits"]


def session_count(api: httpx.Client) -> int:
    return len(api.get("/v1/sessions").json()["sessions"])


def padded_session_body(size: int) -> bytes:
    """A valid session body of exactly `size` bytes (whitespace after the object)."""
    body = b'{"labels": {}}'
    return body + b" " * (size - len(body))


def chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    """`body` as a stream: httpx sends it chunked, with no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def assert_still_serving(other: httpx.Client) -> None:
    assert other.get("/v1/training/capabilities").status_code == 200
    assert other.post("/v1/sessions", json={}).status_code == 200


@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_max_body_bytes_is_413_quickly_and_nothing_is_stored(
    api: httpx.Client, other: httpx.Client, streamed: bool
) -> None:
    limit = limits(api)["max_body_bytes"]
    before = session_count(api)
    label = b"x" * (limit + 1 - len(b'{"labels": {"big": ""}}'))
    body = b'{"labels": {"big": "' + label + b'"}}'
    assert len(body) == limit + 1
    started = time.monotonic()
    response = api.post("/v1/sessions", content=chunks(body) if streamed else body, headers=JSON)
    assert time.monotonic() - started < 10
    error = assert_error(response, 413, "payload_too_large", "max_body_bytes", str(limit))
    assert error["details"]["field"] == "body"
    assert error["details"]["max"] == limit
    assert error["details"]["value"] >= limit + 1
    assert session_count(api) == before
    assert_still_serving(other)


def test_a_declared_content_length_over_the_limit_is_refused_before_the_body_is_sent(
    api: httpx.Client,
) -> None:
    limit = limits(api)["max_body_bytes"]
    url = httpx.URL(str(api.base_url))
    head = (
        f"POST /v1/sessions HTTP/1.1\r\nHost: {url.host}\r\n"
        f"Authorization: {api.headers['authorization']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {limit * 1000}\r\n\r\n{{}}"
    )
    with socket.create_connection((url.host, url.port), timeout=10) as conn:
        conn.sendall(head.encode())
        answer = ""
        while "payload_too_large" not in answer and (chunk := conn.recv(65536)):
            answer += chunk.decode()
    assert answer.startswith("HTTP/1.1 413 "), answer
    assert '"payload_too_large"' in answer and str(limit * 1000) in answer


def test_a_body_of_exactly_max_body_bytes_is_read(api: httpx.Client) -> None:
    limit = limits(api)["max_body_bytes"]
    response = api.post("/v1/sessions", content=padded_session_body(limit), headers=JSON)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_a_body_that_is_not_strict_json_is_a_400_and_creates_no_session(
    api: httpx.Client, other: httpx.Client, case: str
) -> None:
    body, field, needle = BAD_BODIES[case]
    before = session_count(api)
    response = api.post("/v1/sessions", content=body, headers=JSON)
    error = assert_error(response, 400, "invalid_request", needle)
    assert error["details"]["field"] == field
    error["message"].encode("utf-8")  # the refusal itself holds no lone surrogate
    assert session_count(api) == before
    assert_still_serving(other)


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_an_operation_body_that_is_not_strict_json_leaves_next_seq_id(
    api: httpx.Client, other: httpx.Client, case: str
) -> None:
    body, _, needle = BAD_BODIES[case]
    run = new_run(api)
    path = f"/v1/training/runs/{run['run_id']}/operations"
    response = api.post(path, content=body, headers=JSON)
    assert_error(response, 400, "invalid_request", needle)
    after = api.get(f"/v1/training/runs/{run['run_id']}").json()
    assert after["next_seq_id"] == run["next_seq_id"] == 1
    assert api.get(f"{path}").json()["operations"] == []
    assert_still_serving(other)


def test_an_operation_body_over_the_limit_is_413_and_leaves_next_seq_id(api: httpx.Client) -> None:
    limit = limits(api)["max_body_bytes"]
    run = new_run(api)
    pad = b" " * limit
    body = b'{"seq_id": 1, "kind": "save_state", "payload": {}}' + pad
    response = api.post(f"/v1/training/runs/{run['run_id']}/operations", content=body, headers=JSON)
    assert_error(response, 413, "payload_too_large")
    assert api.get(f"/v1/training/runs/{run['run_id']}").json()["next_seq_id"] == 1


def test_a_surrogate_pair_is_one_character_and_accepted(api: httpx.Client) -> None:
    body = b'{"labels": {"emoji": "\\ud83d\\ude00", "raw": "\xf0\x9f\x98\x80"}}'
    response = api.post("/v1/sessions", content=body, headers=JSON)
    assert response.status_code == 200, response.text
    assert response.json()["labels"] == {"emoji": "\U0001f600", "raw": "\U0001f600"}


def test_nesting_64_deep_is_not_refused_as_too_deep(api: httpx.Client) -> None:
    body = b'{"labels": ' + b"[" * 63 + b"]" * 63 + b"}"
    error = assert_error(
        api.post("/v1/sessions", content=body, headers=JSON), 400, "invalid_request"
    )
    assert "nest" not in error["message"]
    assert error["details"]["field"] == "labels"


def test_an_integer_out_of_a_fields_range_names_the_field(api: httpx.Client) -> None:
    run = new_run(api)
    body = b'{"seq_id": ' + str(2**100).encode() + b', "kind": "save_state"}'
    response = api.post(f"/v1/training/runs/{run['run_id']}/operations", content=body, headers=JSON)
    error = assert_error(response, 400, "invalid_request", "seq_id")
    assert error["details"]["field"] == "seq_id"


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize("where", ["labels.a", "lora_rank", "seed"])
def test_a_non_finite_number_in_a_run_body_is_refused_naming_the_field(
    api: httpx.Client, literal: str, where: str
) -> None:
    session_id = api.post("/v1/sessions", json={}).json()["session_id"]
    fields = {"session_id": f'"{session_id}"', "provider": '"local"', "base_model": '"local/nano"'}
    if where == "labels.a":
        fields["labels"] = '{"a": ' + literal + "}"
    else:
        fields[where] = literal
    body = "{" + ", ".join(f'"{key}": {value}' for key, value in fields.items()) + "}"
    response = api.post("/v1/training/runs", content=body.encode(), headers=JSON)
    error = assert_error(response, 400, "invalid_request", where)
    assert error["details"]["field"] == where
    assert api.get(f"/v1/sessions/{session_id}").json()["run_ids"] == []


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize("case", list(NON_FINITE_OPERATIONS))
def test_a_non_finite_number_in_an_operation_is_refused_and_leaves_next_seq_id(
    api: httpx.Client, literal: str, case: str
) -> None:
    template, field = NON_FINITE_OPERATIONS[case]
    run = new_run(api)
    path = f"/v1/training/runs/{run['run_id']}/operations"
    if case == "a sampler float":
        sampler = api.post(path, json={"seq_id": 1, "kind": "save_weights_for_sampler"}).json()
        sampler = api.get(f"{path}/1", params={"wait_s": 60}).json()
        path = f"/v1/training/runs/{run['run_id']}/samplers/{sampler['result']['sampler_id']}"
        path += "/operations"
        template = template.replace('"seq_id": 1', '"seq_id": 2')
    response = api.post(path, content=(template % literal).encode(), headers=JSON)
    error = assert_error(response, 400, "invalid_request", field)
    assert error["details"]["field"] == field
    after = api.get(f"/v1/training/runs/{run['run_id']}").json()
    assert after["next_seq_id"] == (2 if case == "a sampler float" else 1)


def test_a_client_leaving_mid_body_is_no_server_error(
    api: httpx.Client, other: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    url = httpx.URL(str(api.base_url))
    head = (
        f"POST /v1/sessions HTTP/1.1\r\nHost: {url.host}\r\n"
        f"Authorization: {api.headers['authorization']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        '{"labels": {'
    )
    with caplog.at_level("ERROR", logger="whitney.local.app"):
        with socket.create_connection((url.host, url.port), timeout=10) as conn:
            conn.sendall(head.encode())
            time.sleep(0.2)
        assert_still_serving(other)
        time.sleep(0.2)
    assert [r for r in caplog.records if r.name == "whitney.local.app"] == []
