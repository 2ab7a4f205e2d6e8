"""Small builders for the server tests: raw HTTP with the Whitney error body in view."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from fastapi.routing import APIRoute

from whitney.local import EmbeddedWhitney
from whitney.local.app import create_app
from whitney.local.config import ServerConfig
from whitney.local.service import WhitneyService


def http(server: EmbeddedWhitney, key: str | None = None, **kwargs: Any) -> httpx.Client:
    """A raw httpx client on the server, authenticated with `key` (default: tenant A)."""
    headers = {} if key == "" else {"Authorization": f"Bearer {key or server.api_key}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=60, **kwargs)


def tensor(dtype: str, values: list) -> dict:
    return {"dtype": dtype, "shape": [len(values)], "values": list(values)}


def datum(prompt: list[int], completion: list[int], **per_token: list[float]) -> dict:
    """A right-shifted datum: weights 0 on prompt positions, 1 on completion positions;
    `per_token` tensors are given for completion positions only (0 on prompt positions)."""
    full = list(prompt) + list(completion)
    pad = len(prompt) - 1
    loss_inputs = {
        "target_tokens": tensor("int64", full[1:]),
        "weights": tensor("float32", [0.0] * pad + [1.0] * len(completion)),
    }
    for name, values in per_token.items():
        assert len(values) == len(completion), name
        loss_inputs[name] = tensor("float32", [0.0] * pad + [float(v) for v in values])
    return {"input": {"token_ids": full[:-1]}, "loss_inputs": loss_inputs}


def forward(data: list[dict], loss: str, config: dict | None = None) -> dict:
    return {"data": data, "loss_function": loss, "loss_config": dict(config or {})}


def sample_request(prompt: list[int], n: int, max_tokens: int, **params: Any) -> dict:
    return {
        "prompt": {"token_ids": list(prompt)},
        "num_samples": n,
        "sampling_params": {"max_tokens": max_tokens, **params},
    }


def adamw(lr: float = 1e-3, **kw: float) -> dict:
    return {"optimizer": {"type": "adamw", "learning_rate": lr, **kw}}


def new_session(client: httpx.Client, labels: dict[str, str] | None = None) -> str:
    response = client.post("/v1/sessions", json={"labels": labels or {}})
    assert response.status_code == 200, response.text
    return response.json()["session_id"]


def new_run(client: httpx.Client, session_id: str | None = None, **body: Any) -> dict:
    session_id = session_id or new_session(client)
    payload = {"session_id": session_id, "provider": "local", "base_model": "local/nano", **body}
    response = client.post("/v1/training/runs", json=payload)
    assert response.status_code == 200, response.text
    run = response.json()
    assert run["status"] == "ready"
    return run


TERMINAL = ("succeeded", "failed", "cancelled")


def post_op(
    client: httpx.Client,
    run_id: str,
    seq_id: int,
    kind: str,
    payload: dict,
    sampler_id: str | None = None,
) -> httpx.Response:
    path = f"/v1/training/runs/{run_id}/operations"
    if sampler_id is not None:
        path = f"/v1/training/runs/{run_id}/samplers/{sampler_id}/operations"
    return client.post(path, json={"seq_id": seq_id, "kind": kind, "payload": payload})


def wait_op(
    client: httpx.Client,
    run_id: str,
    seq_id: int,
    timeout: float = 60,
    parse: Callable[[str], Any] = json.loads,
) -> dict:
    """The operation, once terminal or after `timeout` s of long polling; read by `parse`."""
    response = client.get(
        f"/v1/training/runs/{run_id}/operations/{seq_id}", params={"wait_s": timeout}
    )
    assert response.status_code == 200, response.text
    return parse(response.text)


def submit_op(
    client: httpx.Client, *operation: Any, parse: Callable[[str], Any] = json.loads
) -> dict:
    """`post_op(client, run_id, seq_id, kind, payload[, sampler_id])` and wait for a terminal
    status; each answer read by `parse`."""
    response = post_op(client, *operation)
    assert response.status_code == 200, response.text
    op = parse(response.text)
    if op["status"] not in TERMINAL:
        run_id, seq_id = operation[:2]
        op = wait_op(client, run_id, seq_id, parse=parse)
        assert op["status"] in TERMINAL, op
    return op


def run_op(client: httpx.Client, *operation: Any) -> dict:
    """`submit_op(client, run_id, seq_id, kind, payload[, sampler_id])`; the operation must
    succeed."""
    op = submit_op(client, *operation)
    assert op["status"] == "succeeded", op
    return op


def assert_error(response: httpx.Response, status: int, type_: str, *needles: str) -> dict:
    """The response is the Whitney error body with this status and type, naming `needles`."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"type", "message", "details"}, error
    assert error["type"] == type_, error
    assert isinstance(error["details"], dict)
    for needle in needles:
        assert needle in error["message"], (needle, error["message"])
    assert "Traceback" not in error["message"]
    return error


def journal_rows(server: EmbeddedWhitney, run_id: str) -> list[dict]:
    """The run's operations straight from the server's SQLite journal, every column (the
    `executions` count and the payload's JSON text included), in seq id order; the flow tests
    read it too (`flowtest_helpers`)."""
    path = Path(server.data_dir) / "journal.sqlite3"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            "SELECT * FROM operations WHERE run_id=? ORDER BY seq_id", (run_id,)
        ).fetchall()
        return [dict(row) for row in rows]
    finally:
        conn.close()


def declared_routes(data_dir: Path) -> dict[tuple[str, str], bool]:
    """`(method, path)` of every route `create_app` declares (method in lower case) -> whether
    the OpenAPI document names it, read off the app itself."""
    service = WhitneyService(ServerConfig(data_dir=data_dir, api_keys=["k"]))
    app = create_app(service)
    service.shutdown()
    return {
        (method.lower(), route.path): route.include_in_schema
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
