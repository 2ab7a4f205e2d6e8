"""The server as an attacker meets it: its OpenAPI document is valid and names every route,
and schemathesis, generating from that document (valid and invalid requests), finds no 5xx
and no refusal without the error body, against `serve` in its own process; it survives
within a memory bound. The four 500s found by hand are regression cases here."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import requests
import schemathesis

# Loaded at collection, not lazily inside a test: pytest rewrites a plugin's modules as they load,
# and Python 3.11 can fail building their AST while other threads of the worker run (SystemError
# "AST constructor recursion depth mismatch", CPython gh-106905).
import schemathesis.specs.openapi.schemas  # noqa: F401
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode

from whitney.local import openapi

from .helpers import assert_error, declared_routes, new_run
from .served import ServedWhitney, served

EXAMPLES = int(os.environ.get("WHITNEY_FUZZ_EXAMPLES", "20"))
"""Examples per operation, generation mode and id set (about 900 requests in all); set
WHITNEY_FUZZ_EXAMPLES for a longer hunt."""
RSS_BOUND_MB = 2048.0


@dataclass
class Findings:
    """What the fuzzer saw: request counts by status and every answer that breaks a rule."""

    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def record(self, case: Case, response: requests.Response) -> None:
        status = response.status_code
        self.statuses[status] = self.statuses.get(status, 0) + 1
        problem = _problem(response)
        if problem:
            request = response.request
            self.failures.append(
                f"{problem}: {case.method} {request.url}\n  body: {str(request.body)[:400]}\n"
                f"  -> {status} {response.text[:400]}"
            )


def _problem(response: requests.Response) -> str | None:
    """Why `response` breaks the contract: a 5xx, or a refusal not in the error body."""
    if response.status_code >= 500:
        return "server error"
    if response.status_code < 400:
        return None
    try:
        body = response.json()
    except ValueError:
        return "refusal is not JSON"
    if not isinstance(body, dict) or set(body) != {"error"}:
        return "refusal is not {'error': ...}"
    error = body["error"]
    if not isinstance(error, dict) or set(error) != {"type", "message", "details"}:
        return "error object is not {type, message, details}"
    if not isinstance(error["details"], dict) or not isinstance(error["message"], str):
        return "error object has the wrong types"
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWhitney]:
    with served(tmp_path_factory.mktemp("fuzz")) as whitney:
        yield whitney


@pytest.fixture(scope="module")
def document(server: ServedWhitney) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/openapi.json", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


# --------------------------------------------------------------------------- the document


def test_the_openapi_document_is_valid_and_names_every_route(
    document: dict[str, Any], tmp_path: Path
) -> None:
    assert document["openapi"].startswith("3.")
    schemathesis.openapi.from_dict(document).validate()
    named = {(m, path) for path, item in document["paths"].items() for m in item}
    assert named == {
        route for route, in_document in declared_routes(tmp_path).items() if in_document
    }
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document["security"] == [{"bearer": []}]


def test_every_operation_has_its_error_body_and_every_post_with_a_body_its_schema(
    document: dict[str, Any],
) -> None:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            error = {"$ref": "#/components/schemas/ErrorBody"}
            for status in ("4XX", "5XX"):
                content = operation["responses"][status]["content"]
                assert content["application/json"]["schema"] == error, (method, path)
            if (method, path) in openapi.BODIES:
                assert "application/json" in operation["requestBody"]["content"], path
    bodies = [
        item["post"].get("requestBody") for item in document["paths"].values() if "post" in item
    ]
    assert sum(body is not None for body in bodies) == 4


def test_path_and_query_parameters_are_in_the_document(document: dict[str, Any]) -> None:
    def names(method: str, path: str) -> set[str]:
        return {p["name"] for p in document["paths"][path][method].get("parameters", [])}

    assert names("get", "/v1/training/runs/{run_id}/operations") == {
        "run_id",
        "after_seq",
        "limit",
    }
    assert names("get", "/v1/training/runs/{run_id}/operations/{seq_id}") == {
        "run_id",
        "seq_id",
        "wait_s",
    }
    assert names("get", "/v1/sessions") == {"label"}
    assert "Idempotency-Key" in names("post", "/v1/sessions")


# --------------------------------------------------------------------------- the fuzzer


def fuzz_operation(
    schema: schemathesis.BaseSchema,
    label: str,
    send: Callable[[Case], requests.Response],
    findings: Findings,
    path_parameters: dict[str, Any] | None = None,
) -> None:
    """`EXAMPLES` valid and `EXAMPLES` invalid requests of one operation, each recorded."""
    operation = schema.find_operation_by_label(label)
    assert operation is not None, label
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        strategy = operation.as_strategy(mode, path_parameters=path_parameters)

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def run(case: Case) -> None:
            findings.record(case, send(case))

        run()


def real_ids(server: ServedWhitney) -> dict[str, str]:
    """A fresh session, a ready run on it and a sampler of that run, all tenant A's."""
    with server.client(0) as client:
        run = new_run(client)
        path = f"/v1/training/runs/{run['run_id']}/operations"
        saved = client.post(path, json={"seq_id": 1, "kind": "save_weights_for_sampler"})
        assert saved.status_code == 200, saved.text
        sampler = client.get(f"{path}/1", params={"wait_s": 60}).json()
        assert sampler["status"] == "succeeded", sampler
    return {
        "session_id": run["session_id"],
        "run_id": run["run_id"],
        "sampler_id": sampler["result"]["sampler_id"],
    }


def test_the_fuzzer_finds_no_server_error_and_the_server_survives(
    server: ServedWhitney, document: dict[str, Any]
) -> None:
    schema = schemathesis.openapi.from_dict(document)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {server.keys[0]}"

    def send(case: Case) -> requests.Response:
        return case.call(base_url=server.url, session=session, timeout=60)

    findings = Findings()
    labels = [operation.ok().label for operation in schema.get_all_operations()]
    for label in labels:
        fuzz_operation(schema, label, send, findings)
        names = {part[1:-1] for part in label.split("/") if part.startswith("{")}
        if names & {"session_id", "run_id", "sampler_id"}:
            ids = real_ids(server)
            known = {name: ids[name] for name in names if name in ids}
            fuzz_operation(schema, label, send, findings, known)
    rss = server.rss_mb()
    total = sum(findings.statuses.values())
    print(f"fuzzed {len(labels)} operations with {total} requests: {findings.statuses}")
    print(f"server RSS after: {rss:.0f} MiB")
    assert findings.failures == [], "\n".join(findings.failures)
    assert server.alive()
    assert rss < RSS_BOUND_MB


# --------------------------------------------------------------------------- regressions


def test_the_four_500s_found_by_hand_are_400s(server: ServedWhitney) -> None:
    with server.client(0) as client:
        run_id = new_run(client)["run_id"]
        surrogate = b'{"labels": {"who": "\\ud800"}}'
        response = client.post("/v1/sessions", content=surrogate)
        assert_error(response, 400, "invalid_request", "surrogate")
        deep = b'{"labels": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        response = client.post("/v1/sessions", content=deep)
        assert_error(response, 400, "invalid_request", "nest deeper than 64")
        response = client.get(f"/v1/training/runs/{run_id}/operations?after_seq={2**70}")
        assert_error(response, 400, "invalid_request", "after_seq")
        response = client.get(f"/v1/training/runs/{run_id}/operations/{2**70}")
        assert_error(response, 400, "invalid_request", "seq_id")
        assert json.loads(client.get(f"/v1/training/runs/{run_id}").text)["next_seq_id"] == 1
    assert server.alive()
