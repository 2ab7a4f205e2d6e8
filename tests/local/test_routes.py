"""Every route of docs/api.md over HTTP against the real embedded server: status codes,
error bodies, auth, tenant isolation, idempotency, the run state machine, long-polls."""

from __future__ import annotations

import hashlib
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from whitney.local import EmbeddedWhitney
from whitney.local.limits import Limits

from .helpers import (
    adamw,
    assert_error,
    datum,
    forward,
    http,
    new_run,
    new_session,
    post_op,
    run_op,
    sample_request,
    wait_op,
)
from .long_polls import long_poll, until_held

API_MD = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
CE = forward([datum([1, 2, 3], [4, 5, 6])], "cross_entropy")
RL = forward(
    [datum([1, 2, 3], [4, 5, 6], logprobs=[-5.0, -5.0, -5.0], advantages=[1.0, -1.0, 0.5])],
    "importance_sampling",
)


def all_routes(run_id: str = "run-x", session_id: str = "sess-x") -> list[tuple[str, str]]:
    return [
        ("GET", "/v1/training/capabilities"),
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions"),
        ("GET", f"/v1/sessions/{session_id}"),
        ("POST", f"/v1/sessions/{session_id}/close"),
        ("POST", "/v1/training/runs"),
        ("GET", f"/v1/training/runs/{run_id}"),
        ("POST", f"/v1/training/runs/{run_id}/finish"),
        ("POST", f"/v1/training/runs/{run_id}/cancel"),
        ("POST", f"/v1/training/runs/{run_id}/operations"),
        ("POST", f"/v1/training/runs/{run_id}/samplers/s/operations"),
        ("GET", f"/v1/training/runs/{run_id}/operations/1"),
        ("GET", f"/v1/training/runs/{run_id}/operations"),
        ("GET", "/v1/artifacts/art-x"),
    ]


# --------------------------------------------------------------------------- auth


@pytest.mark.parametrize(
    "header", [None, "Bearer wrong-key", "Basic dGVzdA==", "Bearer", "bearer  x y"]
)
def test_every_route_needs_a_valid_bearer_key(embedded_server, api, header):
    run = new_run(api)
    headers = {} if header is None else {"Authorization": header}
    with httpx.Client(base_url=embedded_server.url, headers=headers) as anonymous:
        for method, path in all_routes(run["run_id"], run["session_id"]):
            response = anonymous.request(method, path, json={})
            assert_error(response, 401, "unauthorized")
            assert embedded_server.api_key not in response.text


def test_another_tenants_resources_are_not_found(embedded_server, api, other):
    run = new_run(api)
    run_id, session_id = run["run_id"], run["session_id"]
    run_op(api, run_id, 1, "save_state", {"name": "a"})
    exported = run_op(api, run_id, 2, "export_lora", {})["result"]
    checkpoint = f"whitney://runs/{run_id}/states/a"

    for method, path in all_routes(run_id, session_id):
        if path in ("/v1/training/capabilities", "/v1/sessions", "/v1/training/runs"):
            continue
        path = path.replace("art-x", exported["artifact_id"])
        body = {"seq_id": 3, "kind": "export_lora", "payload": {}}
        assert_error(other.request(method, path, json=body), 404, "not_found")
    listed = other.get("/v1/sessions").json()["sessions"]
    assert session_id not in [s["session_id"] for s in listed]
    # a run in A's session, from A's checkpoint, loading A's checkpoint: all 404 for B
    assert_error(
        other.post(
            "/v1/training/runs",
            json={"session_id": session_id, "provider": "local", "base_model": "local/nano"},
        ),
        404,
        "not_found",
    )
    mine = new_session(other)
    body = {"session_id": mine, "provider": "local", "base_model": "local/nano"}
    assert_error(
        other.post("/v1/training/runs", json=body | {"from_checkpoint": checkpoint}),
        404,
        "not_found",
        "from_checkpoint",
    )
    other_run = new_run(other, mine)
    response = post_op(other, other_run["run_id"], 1, "load_state", {"checkpoint": checkpoint})
    assert_error(response, 404, "not_found", "checkpoint")
    # A still sees everything
    assert api.get(f"/v1/artifacts/{exported['artifact_id']}").status_code == 200


# --------------------------------------------------------------------------- capabilities


def documented_list(field: str) -> list[str]:
    """The names docs/api.md gives for the embedded server's capabilities `field` ("`field`
    is `a`, `b`, ..."), in its order."""
    text = " ".join(API_MD.split())
    match = re.search(rf"`{field}` is (`[^`]+`(?:, `[^`]+`)*)", text)
    assert match, f"docs/api.md does not list {field}"
    return re.findall(r"`([^`]+)`", match.group(1))


def test_capabilities_lists_providers_and_never_losses(api):
    response = api.get("/v1/training/capabilities")
    assert response.status_code == 200
    doc = response.json()
    assert doc["api_version"] == "1"
    assert set(doc["providers"]) == {"modal", "tinker", "local"}
    for provider in doc["providers"].values():
        assert {"local/nano", "local/tiny", "local/small"} <= set(provider["base_models"])
        assert provider["max_lora_rank"] >= 8
        assert provider["run_operations"] == documented_list("run_operations")
        assert provider["sampler_operations"] == documented_list("sampler_operations")
    assert "loss" not in response.text


# --------------------------------------------------------------------------- sessions


def test_sessions_labels_lookup_get_and_close(api):
    flow = f"flow-{time.monotonic_ns()}"
    first = new_session(api, {"prefect.flow-run-id": flow, "team": "a"})
    second = new_session(api, {"prefect.flow-run-id": flow})
    new_session(api, {"prefect.flow-run-id": "someone-else"})

    found = api.get("/v1/sessions", params={"label": f"prefect.flow-run-id:{flow}"}).json()
    assert [s["session_id"] for s in found["sessions"]] == [first, second]
    both = api.get(
        "/v1/sessions", params=[("label", f"prefect.flow-run-id:{flow}"), ("label", "team:a")]
    ).json()
    assert [s["session_id"] for s in both["sessions"]] == [first]
    assert_error(api.get("/v1/sessions", params={"label": "no-colon"}), 400, "invalid_request")

    session = api.get(f"/v1/sessions/{first}").json()
    assert session["status"] == "open"
    assert session["labels"] == {"prefect.flow-run-id": flow, "team": "a"}
    assert session["run_ids"] == []
    run = new_run(api, first)
    assert api.get(f"/v1/sessions/{first}").json()["run_ids"] == [run["run_id"]]

    closed = api.post(f"/v1/sessions/{first}/close")
    assert closed.status_code == 200
    assert closed.json()["status"] == "closed"
    assert api.get(f"/v1/training/runs/{run['run_id']}").json()["status"] == "cancelled"
    again = api.post(f"/v1/sessions/{first}/close")
    assert again.status_code == 200 and again.json()["status"] == "closed"
    body = {"session_id": first, "provider": "local", "base_model": "local/nano"}
    assert_error(api.post("/v1/training/runs", json=body), 409, "run_not_active", "closed")
    assert_error(api.get("/v1/sessions/sess-missing"), 404, "not_found")


def test_session_create_validation(api):
    assert_error(
        api.post("/v1/sessions", json={"labels": {"a": 1}}), 400, "invalid_request", "labels"
    )
    assert_error(api.post("/v1/sessions", json={"tags": {}}), 400, "invalid_request", "tags")
    response = api.post(
        "/v1/sessions", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert_error(response, 400, "invalid_request", "JSON")
    assert api.post("/v1/sessions").status_code == 200  # an empty body is {}


@pytest.mark.parametrize("route", ["/v1/sessions", "/v1/training/runs"])
def test_idempotency_key_on_create(api, route):
    session_id = new_session(api)
    body = (
        {"labels": {"k": "v"}}
        if route == "/v1/sessions"
        else {"session_id": session_id, "provider": "local", "base_model": "local/nano"}
    )
    key = f"key-{time.monotonic_ns()}"
    first = api.post(route, json=body, headers={"Idempotency-Key": key})
    second = api.post(route, json=body, headers={"Idempotency-Key": key})
    assert first.status_code == second.status_code == 200
    ident = "session_id" if route == "/v1/sessions" else "run_id"
    assert first.json()[ident] == second.json()[ident]
    changed = dict(body)
    if route == "/v1/sessions":
        changed["labels"] = {"k": "other"}
    else:
        changed["lora_rank"] = 4
    assert_error(
        api.post(route, json=changed, headers={"Idempotency-Key": key}),
        409,
        "idempotency_conflict",
    )
    third = api.post(route, json=body)  # no key: a new resource
    assert third.json()[ident] != first.json()[ident]
    if route == "/v1/training/runs":
        run_ids = api.get(f"/v1/sessions/{session_id}").json()["run_ids"]
        assert len(run_ids) == 2


# --------------------------------------------------------------------------- runs


def test_run_create_get_and_refusals(api):
    session_id = new_session(api)
    run = new_run(api, session_id, lora_rank=4, seed=7, labels={"x": "y"})
    for key in (
        "run_id",
        "session_id",
        "provider",
        "base_model",
        "lora_rank",
        "role",
        "trainable",
        "status",
        "next_seq_id",
        "step",
        "error",
        "created_at",
    ):
        assert key in run
    assert (run["lora_rank"], run["role"], run["trainable"], run["next_seq_id"]) == (
        4,
        "policy",
        True,
        1,
    )
    assert api.get(f"/v1/training/runs/{run['run_id']}").json()["run_id"] == run["run_id"]
    assert_error(api.get("/v1/training/runs/run-missing"), 404, "not_found")

    base = {"session_id": session_id, "provider": "local", "base_model": "local/nano"}
    cases = [
        ({"provider": "openai"}, 400, "invalid_request", "provider"),
        ({"base_model": "local/huge"}, 422, "unsupported_base_model", "local/huge"),
        ({"base_model": "hf:nobody/not-cached-model"}, 422, "unsupported_base_model", "hf:"),
        ({"lora_rank": 0}, 400, "invalid_request", "lora_rank"),
        ({"lora_rank": 100000}, 400, "invalid_request", "lora_rank"),
        ({"role": "critic", "provider": "tinker"}, 400, "invalid_request", "critic"),
        ({"role": "judge"}, 400, "invalid_request", "role"),
        ({"session_id": "sess-missing"}, 404, "not_found", "sess-missing"),
        ({"from_checkpoint": "s3://bucket/x"}, 400, "invalid_request", "from_checkpoint"),
        (
            {"from_checkpoint": f"whitney://runs/{run['run_id']}/states/never"},
            404,
            "not_found",
            "from_checkpoint",
        ),
        ({"unknown": 1}, 400, "invalid_request", "unknown"),
    ]
    for change, status, type_, needle in cases:
        assert_error(api.post("/v1/training/runs", json=base | change), status, type_, needle)
    # nothing half-created
    assert api.get(f"/v1/sessions/{session_id}").json()["run_ids"] == [run["run_id"]]


def test_finish_drains_then_is_idempotent(api):
    run = new_run(api)
    run_id = run["run_id"]
    for seq in range(1, 4):
        assert post_op(api, run_id, seq, "forward_backward", CE).status_code == 200
    finished = api.post(f"/v1/training/runs/{run_id}/finish").json()
    deadline = time.monotonic() + 60
    while finished["status"] != "finished":  # draining: polled until it has finished
        assert finished["status"] == "finishing" and time.monotonic() < deadline, finished
        finished = api.get(f"/v1/training/runs/{run_id}").json()
    ops = api.get(f"/v1/training/runs/{run_id}/operations").json()["operations"]
    assert [op["status"] for op in ops] == ["succeeded"] * 3
    assert api.post(f"/v1/training/runs/{run_id}/finish").json()["status"] == "finished"
    assert api.post(f"/v1/training/runs/{run_id}/cancel").json()["status"] == "finished"
    assert_error(post_op(api, run_id, 4, "forward", CE), 409, "run_not_active", "finished")
    # a resend of a journaled operation still answers
    assert post_op(api, run_id, 1, "forward_backward", CE).json()["status"] == "succeeded"


def test_finish_fails_operations_waiting_on_a_gap(api):
    run_id = new_run(api)["run_id"]
    run_op(api, run_id, 1, "forward", CE)
    assert post_op(api, run_id, 3, "forward", CE).json()["status"] == "pending"
    assert api.post(f"/v1/training/runs/{run_id}/finish").json()["status"] == "finished"
    op = wait_op(api, run_id, 3)
    assert op["status"] == "failed" and op["error"]["type"] == "seq_gap"


def test_cancel_makes_pending_operations_cancelled(api):
    run_id = new_run(api)["run_id"]
    run_op(api, run_id, 1, "forward", CE)
    pending = [post_op(api, run_id, seq, "forward", CE).json() for seq in (3, 4)]
    assert [op["status"] for op in pending] == ["pending", "pending"]
    cancelled = api.post(f"/v1/training/runs/{run_id}/cancel").json()
    assert cancelled["status"] == "cancelled"
    for seq in (3, 4):
        assert wait_op(api, run_id, seq)["status"] == "cancelled"
    assert api.post(f"/v1/training/runs/{run_id}/cancel").json()["status"] == "cancelled"
    assert api.post(f"/v1/training/runs/{run_id}/finish").json()["status"] == "cancelled"
    assert_error(post_op(api, run_id, 2, "forward", CE), 409, "run_not_active", "cancelled")


# --------------------------------------------------------------------------- operations


def test_a_full_cycle_of_operations(api):
    run_id = new_run(api, seed=3)["run_id"]
    sampler = run_op(api, run_id, 1, "save_weights_for_sampler", {})
    sampler_id = sampler["result"]["sampler_id"]
    assert sampler_id == "sampler-1"
    sample = run_op(api, run_id, 2, "sample", sample_request([1, 2, 3], 2, 5), sampler_id)
    result = sample["result"]
    assert result["prompt_tokens"] == 3 and len(result["sequences"]) == 2
    for seq in result["sequences"]:
        assert len(seq["tokens"]) == len(seq["logprobs"]) == 5 or seq["stop_reason"] == "stop"
    assert sample["sampler_id"] == sampler_id
    assert sample["usage"]["tokens"] > 0
    logprobs = run_op(
        api, run_id, 3, "logprobs", {"sequences": [{"token_ids": [1, 2, 3]}]}, sampler_id
    )
    assert logprobs["result"]["logprobs"][0][0] is None
    assert len(logprobs["result"]["logprobs"][0]) == 3
    fb = run_op(api, run_id, 4, "forward_backward", RL)
    assert set(fb["result"]) >= {"loss", "metrics", "outputs"}
    assert fb["usage"]["tokens"] == 5
    step = run_op(api, run_id, 5, "optim_step", adamw(1e-3, grad_clip_norm=1.0))
    assert step["result"]["step"] == 1
    assert set(step["result"]["metrics"]) >= {"grad_norm", "learning_rate"}
    saved = run_op(api, run_id, 6, "save_state", {})
    assert saved["result"] == {"checkpoint": f"whitney://runs/{run_id}/states/seq-6", "step": 1}
    loaded = run_op(api, run_id, 7, "load_state", {"checkpoint": saved["result"]["checkpoint"]})
    assert loaded["result"]["step"] == 1
    exported = run_op(api, run_id, 8, "export_lora", {})["result"]
    assert exported["format"] == "peft" and len(exported["sha256"]) == 64
    run = api.get(f"/v1/training/runs/{run_id}").json()
    assert (run["step"], run["next_seq_id"]) == (1, 9)

    artifact = api.get(f"/v1/artifacts/{exported['artifact_id']}")
    assert artifact.status_code == 200
    assert len(artifact.content) == exported["bytes"]
    assert hashlib.sha256(artifact.content).hexdigest() == exported["sha256"]
    assert_error(api.get("/v1/artifacts/art-missing"), 404, "not_found")

    for op in api.get(f"/v1/training/runs/{run_id}/operations").json()["operations"]:
        assert op["submitted_at"] <= op["started_at"] <= op["finished_at"]
        for key in ("run_id", "seq_id", "kind", "sampler_id", "status", "result", "error", "usage"):
            assert key in op


def test_named_samplers_and_states(api):
    run_id = new_run(api)["run_id"]
    assert (
        post_op(api, run_id, 1, "save_weights_for_sampler", {"name": "policy-0"}).status_code == 200
    )
    # a sampler op queued on the name before its answer is read
    sample = run_op(api, run_id, 2, "sample", sample_request([5, 6], 1, 3), "policy-0")
    assert sample["status"] == "succeeded"
    assert wait_op(api, run_id, 1)["result"] == {"sampler_id": "policy-0"}
    assert_error(
        post_op(api, run_id, 3, "save_weights_for_sampler", {"name": "policy-0"}),
        409,
        "seq_conflict",
        "policy-0",
    )
    assert_error(
        post_op(api, run_id, 3, "save_weights_for_sampler", {"name": "sampler-1"}),
        409,
        "seq_conflict",
    )
    run_op(api, run_id, 3, "save_state", {"name": "best"})
    assert_error(post_op(api, run_id, 4, "save_state", {"name": "best"}), 409, "seq_conflict")
    assert_error(post_op(api, run_id, 4, "save_state", {"name": ".."}), 400, "invalid_request")
    assert_error(post_op(api, run_id, 4, "save_state", {"name": "a/b"}), 400, "invalid_request")
    missing = post_op(api, run_id, 4, "sample", sample_request([1], 1, 2), "nope")
    assert_error(missing, 404, "not_found", "nope")  # before journaling: seq_id 4 is unused
    assert api.get(f"/v1/training/runs/{run_id}").json()["next_seq_id"] == 4


def test_operation_request_errors(api):
    run_id = new_run(api)["run_id"]
    cases = [
        ({"seq_id": 0, "kind": "forward", "payload": CE}, 400, "invalid_request", "seq_id"),
        ({"seq_id": 1.5, "kind": "forward", "payload": CE}, 400, "invalid_request", "seq_id"),
        ({"kind": "forward", "payload": CE}, 400, "invalid_request", "seq_id"),
        ({"seq_id": 1, "kind": "train", "payload": {}}, 400, "invalid_request", "kind"),
        ({"seq_id": 1, "kind": "sample", "payload": {}}, 400, "invalid_request", "sampler"),
        (
            {"seq_id": 1, "kind": "optim_step", "payload": {"optimizer": {"learning_rate": -1}}},
            400,
            "invalid_request",
            "payload.optimizer.learning_rate",
        ),
        (
            {"seq_id": 1, "kind": "forward", "payload": {"data": [], "loss_function": "ppo"}},
            400,
            "invalid_request",
            "payload.data",
        ),
        ({"seq_id": 1, "kind": "export_lora", "payload": {"x": 1}}, 400, "invalid_request", "x"),
    ]
    for body, status, type_, needle in cases:
        response = api.post(f"/v1/training/runs/{run_id}/operations", json=body)
        assert_error(response, status, type_, needle)
    response = api.post(
        f"/v1/training/runs/{run_id}/samplers/s/operations",
        json={"seq_id": 1, "kind": "forward", "payload": CE},
    )
    assert_error(response, 400, "invalid_request", "run operation")
    response = api.post(
        f"/v1/training/runs/{run_id}/operations",
        content=b"[1, 2",
        headers={"Content-Type": "application/json"},
    )
    assert_error(response, 400, "invalid_request", "JSON")
    response = api.post(f"/v1/training/runs/{run_id}/operations", json=[1, 2])
    assert_error(response, 400, "invalid_request")
    # nothing was journaled
    assert api.get(f"/v1/training/runs/{run_id}").json()["next_seq_id"] == 1


def test_datum_errors_name_the_datum_and_the_tensor(api):
    run_id = new_run(api)["run_id"]
    good = datum([1, 2], [3, 4])
    short = datum([1, 2], [3, 4])
    short["loss_inputs"]["weights"] = {"dtype": "float32", "shape": [2], "values": [0.0, 1.0]}
    error = assert_error(
        post_op(api, run_id, 1, "forward", forward([good, short], "cross_entropy")),
        422,
        "invalid_datum",
        "data[1]",
        "weights",
    )
    assert error["details"]["datum"] == 1 and error["details"]["tensor"] == "weights"

    mismatch = datum([1, 2], [3, 4])
    mismatch["loss_inputs"]["target_tokens"]["shape"] = [5]
    error = assert_error(
        post_op(api, run_id, 1, "forward", forward([good, good, mismatch], "cross_entropy")),
        422,
        "invalid_datum",
        "data[2]",
        "target_tokens",
    )
    assert error["details"]["tensor"] == "target_tokens"

    nan = datum([1, 2], [3, 4], logprobs=[float("nan"), -1.0], advantages=[1.0, 1.0])
    body = json.dumps(
        {"seq_id": 1, "kind": "forward", "payload": forward([nan], "importance_sampling")}
    )
    response = api.post(
        f"/v1/training/runs/{run_id}/operations",
        content=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    error = assert_error(response, 422, "invalid_datum", "data[0]", "logprobs")
    assert error["details"] == error["details"] | {"datum": 0, "tensor": "logprobs"}

    missing = forward([datum([1, 2], [3, 4])], "ppo")
    error = assert_error(
        post_op(api, run_id, 1, "forward", missing), 422, "invalid_datum", "data[0]", "logprobs"
    )
    negative = datum([1, 2], [3, 4])
    negative["input"]["token_ids"][0] = -1
    assert_error(
        post_op(api, run_id, 1, "forward", forward([negative], "cross_entropy")),
        422,
        "invalid_datum",
        "data[0]",
    )
    # the engine's own check (a token beyond the vocabulary) refuses it before journaling
    huge = datum([1, 2], [3, 100000])
    error = assert_error(
        post_op(api, run_id, 1, "forward", forward([huge], "cross_entropy")),
        422,
        "invalid_datum",
        "data[0]",
        "vocabulary",
    )
    assert error["details"] == {"datum": 0, "tensor": "target_tokens"}
    assert api.get(f"/v1/training/runs/{run_id}").json()["next_seq_id"] == 1


@pytest.mark.parametrize(
    ("provider", "payload", "status", "type_", "needles"),
    [
        ("tinker", forward([datum([1], [2])], "gspo"), 422, "unsupported_loss", ["gspo"]),
        ("tinker", forward([datum([1], [2])], "dppo"), 422, "unsupported_loss", ["dppo"]),
        ("modal", forward([datum([1], [2])], "dro"), 422, "unsupported_loss", ["dro"]),
        ("local", forward([datum([1], [2])], "kl_magic"), 422, "unsupported_loss", ["kl_magic"]),
        (
            "modal",
            forward([datum([1], [2])], "cross_entropy", {"beta": 0.1}),
            422,
            "invalid_loss_config",
            ["beta"],
        ),
        (
            "tinker",
            forward(
                [datum([1], [2], logprobs=[-1], advantages=[1])],
                "ppo",
                {"clip_low_threshold": 0.9},
            ),
            422,
            "invalid_loss_config",
            ["clip_low_threshold", "per token"],
        ),
        (
            "modal",
            forward(
                [datum([1], [2], logprobs=[-1], advantages=[1], clip_high_threshold=[1.3])],
                "ppo",
            ),
            422,
            "invalid_datum",
            ["data[0]", "clip_high_threshold"],
        ),
        (
            "local",
            forward([datum([1], [2], logprobs=[-1], advantages=[1])], "ppo_critic"),
            422,
            "unsupported_loss",
            ["critic"],
        ),
    ],
)
def test_provider_emulation(api, provider, payload, status, type_, needles):
    run_id = new_run(api, provider=provider)["run_id"]
    response = post_op(api, run_id, 1, "forward_backward", payload)
    assert_error(response, status, type_, *needles)
    assert api.get(f"/v1/training/runs/{run_id}").json()["next_seq_id"] == 1


@pytest.mark.parametrize(
    ("provider", "payload"),
    [
        (
            "tinker",
            forward(
                [datum([1], [2], logprobs=[-1], advantages=[1], clip_low_threshold=[0.9])], "ppo"
            ),
        ),
        ("tinker", forward([datum([1], [2], logprobs=[-1], advantages=[1])], "dro", {"beta": 0.1})),
        (
            "modal",
            forward(
                [datum([1], [2], logprobs=[-1], advantages=[1])],
                "dppo",
                {"delta_low": 0.1, "delta_high": 0.3},
            ),
        ),
        (
            "local",
            forward(
                [datum([1], [2], logprobs=[-1], advantages=[1], clip_high_threshold=[1.5])],
                "gspo",
                {"clip_low_threshold": 0.5},
            ),
        ),
    ],
)
def test_provider_emulation_accepts(api, provider, payload):
    run_id = new_run(api, provider=provider)["run_id"]
    assert run_op(api, run_id, 1, "forward_backward", payload)["status"] == "succeeded"


def test_frozen_and_critic_runs_refuse_what_they_cannot_do(api):
    frozen = new_run(api, trainable=False)["run_id"]
    for kind, payload in (
        ("forward_backward", CE),
        ("forward", CE),
        ("optim_step", adamw()),
        ("save_state", {}),
        ("export_lora", {}),
    ):
        assert_error(post_op(api, frozen, 1, kind, payload), 400, "invalid_request", "trainable")
    run_op(api, frozen, 1, "save_weights_for_sampler", {"name": "teacher"})
    run_op(api, frozen, 2, "logprobs", {"sequences": [{"token_ids": [1, 2]}]}, "teacher")

    critic = new_run(api, role="critic", provider="modal")["run_id"]
    assert_error(
        post_op(api, critic, 1, "save_weights_for_sampler", {}), 400, "invalid_request", "critic"
    )
    assert_error(
        post_op(api, critic, 1, "sample", sample_request([1], 1, 2), "s"),
        400,
        "invalid_request",
        "critic",
    )
    assert_error(post_op(api, critic, 1, "forward", CE), 422, "unsupported_loss", "critic")
    no_returns = forward([datum([1, 2], [3], values=[0.0])], "ppo_critic")
    assert_error(
        post_op(api, critic, 1, "forward", no_returns), 422, "invalid_datum", "data[0]", "returns"
    )


def test_get_operation_long_poll_and_the_journal_listing(api):
    run_id = new_run(api)["run_id"]
    run_op(api, run_id, 1, "forward", CE)
    assert post_op(api, run_id, 3, "forward", CE).json()["status"] == "pending"
    started = time.monotonic()
    op = api.get(f"/v1/training/runs/{run_id}/operations/3", params={"wait_s": 0.4}).json()
    waited = time.monotonic() - started
    assert op["status"] == "pending" and 0.35 <= waited < 5
    # more than 60 s is clamped, not refused (a terminal operation answers at once)
    clamped = api.get(f"/v1/training/runs/{run_id}/operations/1", params={"wait_s": 3600})
    assert clamped.status_code == 200 and clamped.json()["status"] == "succeeded"
    assert_error(
        api.get(f"/v1/training/runs/{run_id}/operations/3", params={"wait_s": -1}),
        400,
        "invalid_request",
        "wait_s",
    )
    assert_error(
        api.get(f"/v1/training/runs/{run_id}/operations/3", params={"wait_s": "soon"}),
        400,
        "invalid_request",
        "wait_s",
    )
    assert_error(api.get(f"/v1/training/runs/{run_id}/operations/9"), 404, "not_found")
    assert_error(
        api.get(f"/v1/training/runs/{run_id}/operations/x"), 400, "invalid_request", "seq_id"
    )

    run_op(api, run_id, 2, "forward", CE)
    assert wait_op(api, run_id, 3)["status"] == "succeeded"
    for seq in range(4, 8):
        run_op(api, run_id, seq, "forward", CE)
    listing = api.get(f"/v1/training/runs/{run_id}/operations", params={"after_seq": 2, "limit": 3})
    assert [op["seq_id"] for op in listing.json()["operations"]] == [3, 4, 5]
    everything = api.get(f"/v1/training/runs/{run_id}/operations").json()["operations"]
    assert [op["seq_id"] for op in everything] == list(range(1, 8))
    assert_error(
        api.get(f"/v1/training/runs/{run_id}/operations", params={"limit": 0}),
        400,
        "invalid_request",
        "limit",
    )
    assert_error(
        api.get(f"/v1/training/runs/{run_id}/operations", params={"after_seq": "x"}),
        400,
        "invalid_request",
        "after_seq",
    )


def test_a_long_poll_answers_as_soon_as_the_operation_is_terminal(tmp_path: Path) -> None:
    """A long-poll known to be waiting on the server (long_polls.until_held, on a server whose
    long-poll cap is 1) answers once the gap before its operation is filled."""
    server = EmbeddedWhitney(tmp_path / "data", limits=Limits(max_long_polls_per_tenant=1))
    server.start()
    try:
        with http(server) as api, http(server) as second:
            run_id = new_run(api)["run_id"]
            run_op(api, run_id, 1, "forward", CE)
            assert post_op(api, run_id, 3, "forward", CE).json()["status"] == "pending"
            with ThreadPoolExecutor(1) as pool:
                started = time.monotonic()
                poll = pool.submit(long_poll, api, run_id, 3, 30)
                until_held(second, run_id, 3)
                assert not poll.done()
                run_op(second, run_id, 2, "forward", CE)
                answer = poll.result(timeout=30)
                waited = time.monotonic() - started
    finally:
        server.stop()
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded"
    assert waited < 10


def test_unknown_routes_and_methods_use_the_error_body(api):
    """Under the training API's parts of /v1/ (elsewhere under /v1/: OpenAI's shape)."""
    assert_error(api.get("/v1/training/nothing-here"), 404, "not_found")
    assert_error(api.delete("/v1/sessions"), 405, "invalid_request")


def test_an_internal_error_is_500_without_a_traceback(embedded_server, api, monkeypatch, caplog):
    def boom(*args, **kwargs):
        raise RuntimeError("secret internals /very/private/path")

    monkeypatch.setattr(embedded_server.service, "capabilities", boom)
    response = api.get("/v1/training/capabilities")
    error = assert_error(response, 500, "internal")
    assert "secret" not in response.text and "private" not in response.text
    assert error["message"] == "internal server error"
