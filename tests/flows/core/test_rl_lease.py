"""A flow keeps its session's lease for as long as it runs: on a server whose leases last
3 s, an RL flow that outlives two of them finishes, and its session ends closed by the flow,
not by an expired lease (the process-wide client renews it from a thread)."""

from __future__ import annotations

import time

import pytest

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from tasks.names import FLOW_RUN_LABEL
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

TTL_S = 3.0
"""Short, yet three renewals long (one every TTL_S / 3): a lease of 1 s once lapsed in CI, where
the flow's and the server's threads wait for two busy cores."""


def test_a_flow_longer_than_the_lease_keeps_its_session(
    small_config: RLConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        EmbeddedWhitney(session_ttl_s=TTL_S) as server,
        WhitneyClient(server.url, server.api_key) as client,
    ):
        monkeypatch.setenv("WHITNEY_API_KEY", server.api_key)
        # 20 cycles outlive two leases even on a fast CPU (4 took 2.1 s on a Sapphire Rapids)
        config = small_config.model_copy(update={"api_url": server.url, "cycles": 20})
        started = time.monotonic()
        state = rl_flow(config, return_state=True)
        took = time.monotonic() - started
        assert state.is_completed(), state.message
        (session,) = client.list_sessions(f"{FLOW_RUN_LABEL}:{state.state_details.flow_run_id}")
    print(f"the flow ran {took:.1f} s on leases of {TTL_S} s")
    assert took > 2 * TTL_S
    assert (session.status, session.closed_reason) == ("closed", "closed by the client")
