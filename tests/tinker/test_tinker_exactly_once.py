"""A retried Tinker request applies nothing twice: the answers of a `forward_backward` and of an
`optim_step` are lost on the wire (a loopback proxy), the SDK retries them, and the run ends
bit for bit where an undisturbed run ends, with one journaled operation per request."""

from __future__ import annotations

import httpx

from tests.local.served import ServedWhitney
from tests.tinker.proxy import dropping_proxy
from tests.tinker.steps import KEYS, adapter_sha256, assert_same, sdk_key, through_tinker
from whitney import WhitneyClient

LOST = {"/api/v1/forward_backward", "/api/v1/optim_step"}


def test_lost_answers_are_retried_and_applied_once(server: ServedWhitney) -> None:
    undisturbed = through_tinker(server.url, sdk_key(0))
    with dropping_proxy(server.url, LOST) as proxy:
        retried = through_tinker(proxy.url, sdk_key(0))
        assert sorted(proxy.dropped) == sorted(LOST)
    assert_same(retried, undisturbed)
    assert adapter_sha256(server.url, KEYS[0], retried.run_id) == adapter_sha256(
        server.url, KEYS[0], undisturbed.run_id
    )
    with WhitneyClient(server.url, KEYS[0]) as client:
        kinds = [op.kind for op in client.iter_journal(retried.run_id)]
        undisturbed_kinds = [op.kind for op in client.iter_journal(undisturbed.run_id)]
    assert kinds == undisturbed_kinds
    assert kinds.count("forward_backward") == 3 and kinds.count("optim_step") == 3


def test_a_past_seq_id_is_refused_a_resend_answers_the_same_and_a_reused_one_conflicts(
    server: ServedWhitney,
) -> None:
    headers = {"X-API-Key": sdk_key(0)}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:
        session = api.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
        model = {"session_id": session, "model_seq_id": 0, "base_model": "local/tiny"}
        model_id = api.post("/api/v1/create_model", json=model).json()["model_id"]
        step = {"model_id": model_id, "optim_params": {"learning_rate": 0.001}}
        first = api.post("/api/v1/optim_step", json={**step, "seq_id": 3})
        again = api.post("/api/v1/optim_step", json={**step, "seq_id": 3})
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json()
        past = api.post("/api/v1/optim_step", json={**step, "seq_id": 2})
        assert past.status_code == 400
        assert "out of order" in past.json()["error"]["message"]
        other = {**step, "optim_params": {"learning_rate": 0.5}, "seq_id": 3}
        conflict = api.post("/api/v1/optim_step", json=other)
        assert conflict.status_code == 400
        assert conflict.json()["error"]["details"]["field"] == "seq_id"
