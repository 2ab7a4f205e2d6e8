"""Fault injection: seeded, off by default. Under dropped answers the SDK client's retries
(same seq_id) end with exactly the result of a fault-free run."""

from __future__ import annotations

import time

import httpx
import pytest

from whitney.advantages import group_mean_advantages
from whitney.client import WhitneyClient
from whitney.datums import rl_datum
from whitney.local import EmbeddedWhitney

from .helpers import adamw, assert_error, forward, http, new_run, post_op, sample_request

PROMPT = list(b"Once upon ")


def rl_loop(server: EmbeddedWhitney, cycles: int = 10) -> tuple[str, list[float]]:
    """A 10-cycle GRPO-style loop through the SDK client; the final adapter's sha256."""
    with WhitneyClient(
        server.url, server.api_key, max_attempts=25, backoff_base=0.001, backoff_max=0.01
    ) as client:
        session = client.open_session({"test": "faults"})
        run_id = client.create_run(
            session.session_id, "local", "local/nano", lora_rank=4, seed=17
        ).run_id
        losses = []
        for _ in range(cycles):
            sampler_id = client.run_operation(run_id, "save_weights_for_sampler", {})["sampler_id"]
            result = client.sampler_operation(
                run_id, sampler_id, "sample", sample_request(PROMPT, 4, 8)
            )
            rewards = [
                seq["tokens"].count(ord("e")) / 8 + len(seq["tokens"]) / 80
                for seq in result["sequences"]
            ]
            advantages = group_mean_advantages(rewards)
            data = [
                rl_datum(PROMPT, seq["tokens"], seq["logprobs"], advantage)
                for seq, advantage in zip(result["sequences"], advantages, strict=True)
            ]
            fb = client.run_operation(run_id, "forward_backward", forward(data, "ppo"))
            losses.append(fb["loss"])
            client.run_operation(run_id, "optim_step", adamw(1e-2))
        client.run_operation(run_id, "save_state", {})
        exported = client.run_operation(run_id, "export_lora", {})
        client.finish(run_id)
        client.close_session(session.session_id)
        return exported["sha256"], losses


def test_dropped_answers_change_nothing(embedded_server):
    expected_sha, expected_losses = rl_loop(embedded_server)
    with EmbeddedWhitney(drop_after_commit_rate=0.3, fault_seed=7) as faulty:
        sha, losses = rl_loop(faulty)
        counts = faulty.service.faults.counts
    assert counts["drop_close"] > 0 and counts["drop_unavailable"] > 0, counts
    assert losses == expected_losses
    assert sha == expected_sha


def test_fail_before_is_503_and_journals_nothing():
    with EmbeddedWhitney(fail_before_rate=1.0) as server, http(server) as api:
        run_id = new_run(api)["run_id"]
        response = post_op(api, run_id, 1, "save_weights_for_sampler", {})
        error = assert_error(response, 503, "unavailable")
        assert error["details"] == {"fault": "fail_before"}
        assert response.headers["Retry-After"] == "0"
        assert api.get(f"/v1/training/runs/{run_id}").json()["next_seq_id"] == 1


def test_fail_before_and_dropped_answers_together(embedded_server):
    expected_sha, _ = rl_loop(embedded_server, cycles=3)
    with EmbeddedWhitney(fail_before_rate=0.2, drop_after_commit_rate=0.2, fault_seed=3) as server:
        sha, _ = rl_loop(server, cycles=3)
        assert server.service.faults.counts["fail_before"] > 0
    assert sha == expected_sha


def test_a_dropped_connection_is_a_transport_error_and_the_operation_is_journaled():
    with EmbeddedWhitney(drop_after_commit_rate=1.0, fault_seed=1) as server, http(server) as api:
        run_id = new_run(api)["run_id"]
        outcomes = set()
        for seq in range(1, 9):
            try:
                response = post_op(api, run_id, seq, "save_weights_for_sampler", {})
            except httpx.TransportError:
                outcomes.add("closed")
            else:
                assert_error(response, 503, "unavailable")
                outcomes.add("503")
        assert outcomes == {"closed", "503"}
        ops = api.get(f"/v1/training/runs/{run_id}/operations").json()["operations"]
        assert [op["seq_id"] for op in ops] == list(range(1, 9))


@pytest.mark.parametrize("latency_ms", [150])
def test_latency_is_added_to_every_answer(latency_ms):
    with EmbeddedWhitney(latency_ms=latency_ms) as server, http(server) as api:
        for path in ("/v1/training/capabilities", "/v1/sessions", "/v1/nothing"):
            started = time.monotonic()
            api.get(path)
            assert time.monotonic() - started >= latency_ms / 1000
