"""Session leases: a session nobody renews is closed by the server once its lease runs out,
its runs cancelled (a running operation included) and the reason recorded; a heartbeat, or a
`WhitneyClient` that opened the session (it renews by itself every third of the lease),
keeps it open however long the client waits; `session_ttl_s` 0 turns expiry off."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from whitney.client import WhitneyClient
from whitney.leases import LeaseKeeper
from whitney.local import EmbeddedWhitney

from .helpers import assert_error, http, new_run, post_op, sample_request

TTL_S = 1.0
"""The lease of most servers here: short, so that the tests wait little."""
EXPIRED = "lease expired: no heartbeat for 1 s"


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedWhitney]:
    with EmbeddedWhitney(session_ttl_s=TTL_S) as running:
        yield running


@pytest.fixture
def api(server: EmbeddedWhitney) -> Iterator[httpx.Client]:
    with http(server) as client:
        yield client


def session_of(api: httpx.Client, session_id: str) -> dict:
    return api.get(f"/v1/sessions/{session_id}").json()


def wait_closed(api: httpx.Client, session_id: str, within_s: float) -> tuple[dict, float]:
    """The session once closed, and the seconds it took; fails past `within_s`."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        session = session_of(api, session_id)
        if session["status"] == "closed":
            return session, time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"session {session_id} still open after {within_s} s")


def test_the_capabilities_state_the_lease(api: httpx.Client) -> None:
    assert api.get("/v1/training/capabilities").json()["session_ttl_s"] == TTL_S


def test_a_session_nobody_renews_is_closed_and_its_runs_cancelled(api: httpx.Client) -> None:
    opened = time.monotonic()
    run = new_run(api, base_model="local/small")
    session_id, run_id = run["session_id"], run["run_id"]
    assert session_of(api, session_id)["lease_expires_at"] is not None
    assert post_op(api, run_id, 1, "save_weights_for_sampler", {"name": "s"}).status_code == 200
    long_sample = sample_request([1, 2, 3], 16, 1000)
    assert post_op(api, run_id, 2, "sample", long_sample, "s").status_code == 200
    session, _ = wait_closed(api, session_id, within_s=4 * TTL_S + 5)
    lived = time.monotonic() - opened
    print(f"closed {lived:.2f} s after it was opened, never renewed (lease {TTL_S} s)")
    assert session["closed_reason"] == EXPIRED
    assert lived >= TTL_S
    deadline = time.monotonic() + 10
    while api.get(f"/v1/training/runs/{run_id}").json()["status"] != "cancelled":
        assert time.monotonic() < deadline, "the run was not cancelled"
        time.sleep(0.05)
    sample = api.get(f"/v1/training/runs/{run_id}/operations/2").json()
    assert sample["status"] == "cancelled" and sample["error"]["type"] == "cancelled"
    body = {"session_id": session_id, "provider": "local", "base_model": "local/nano"}
    assert_error(api.post("/v1/training/runs", json=body), 409, "run_not_active")
    response = api.post(f"/v1/sessions/{session_id}/heartbeat")
    error = assert_error(response, 409, "run_not_active", "closed", EXPIRED)
    assert error["details"]["closed_reason"] == EXPIRED


def test_heartbeats_keep_a_session_open(api: httpx.Client) -> None:
    session_id = api.post("/v1/sessions", json={}).json()["session_id"]
    for _ in range(int(4 * TTL_S / 0.25)):
        renewed = api.post(f"/v1/sessions/{session_id}/heartbeat")
        assert renewed.status_code == 200, renewed.text
        assert renewed.json()["status"] == "open"
        time.sleep(0.25)
    closed = api.post(f"/v1/sessions/{session_id}/close").json()
    assert (closed["status"], closed["closed_reason"]) == ("closed", "closed by the client")


KEEPER_TTL_S = 3.0
"""The lease where the client's own keeper renews it (every third: 1 s): a renewal may come up
to 2 s late, as on a 2-core machine busy with other tests, and the lease still holds."""


def test_a_client_that_opened_a_session_keeps_its_lease_while_it_waits() -> None:
    with EmbeddedWhitney(session_ttl_s=KEEPER_TTL_S) as server, http(server) as api:
        with WhitneyClient(server.url, server.api_key) as client:
            session_id = client.open_session({"test": "lease"}).session_id
            time.sleep(2 * KEEPER_TTL_S)  # no call at all: only the client's lease keeper
            assert session_of(api, session_id)["status"] == "open"
        session, _ = wait_closed(api, session_id, within_s=2 * KEEPER_TTL_S + 5)  # expiry
        assert session["closed_reason"] == "lease expired: no heartbeat for 3 s"


def test_a_session_ttl_of_0_never_expires() -> None:
    with EmbeddedWhitney(session_ttl_s=0) as server, http(server) as api:
        assert api.get("/v1/training/capabilities").json()["session_ttl_s"] == 0
        session_id = api.post("/v1/sessions", json={}).json()["session_id"]
        assert session_of(api, session_id)["lease_expires_at"] is None
        time.sleep(1.5)
        assert session_of(api, session_id)["status"] == "open"


def test_a_restarted_server_gives_open_sessions_a_fresh_lease(tmp_path) -> None:
    with EmbeddedWhitney(tmp_path, session_ttl_s=600) as server, http(server) as api:
        session_id = api.post("/v1/sessions", json={}).json()["session_id"]
        keys = server.api_keys
    with (
        EmbeddedWhitney(tmp_path, api_keys=keys, session_ttl_s=TTL_S) as server,
        http(server) as api,
    ):
        assert session_of(api, session_id)["status"] == "open"
        session, _ = wait_closed(api, session_id, within_s=4 * TTL_S + 5)
        assert session["closed_reason"] == EXPIRED


def test_the_lease_keeper_outlives_a_failed_renewal() -> None:
    """Any error of one renewal (a dropped connection, a bug in a transport) is logged and the
    next round renews again: a dead keeper would let every held lease run out."""
    renewed: list[str] = []

    def renew(session_id: str) -> None:
        renewed.append(session_id)
        if len(renewed) == 1:
            raise RuntimeError("transport broke")

    keeper = LeaseKeeper(renew, 0.05)
    keeper.hold("sess-a")
    deadline = time.monotonic() + 10
    while len(renewed) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    keeper.stop()
    assert renewed[:3] == ["sess-a"] * 3 and keeper.held() == {"sess-a"}
