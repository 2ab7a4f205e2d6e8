"""Shared fixtures: one embedded Whitney server for the whole test session.

- `embedded_server`: an `EmbeddedWhitney` on a free loopback port with two tenants
  (`api_keys[0]` is `api_key`, `api_keys[1]` another tenant), a temporary data dir;
- `whitney_client`: a `WhitneyClient` on it (fast retries), closed after the test;
- `other_tenant_client`: the same, with the second tenant's key.
"""

from __future__ import annotations

import pytest

from whitney.local import EmbeddedWhitney


@pytest.fixture(scope="session")
def embedded_server():
    """The suite's shared server. Its sessions never expire (session_ttl_s 0): fixtures hold
    runs across many tests with raw HTTP clients, which renew no lease; tests/local/
    test_leases.py tries leases on servers of their own."""
    keys = ["test-key-tenant-a", "test-key-tenant-b"]
    with EmbeddedWhitney(api_keys=keys, session_ttl_s=0) as server:
        yield server


def _client(server: EmbeddedWhitney, key: str):
    from whitney.client import WhitneyClient

    return WhitneyClient(server.url, key, backoff_base=0.01, backoff_max=0.1, poll_wait_s=30.0)


@pytest.fixture
def whitney_client(embedded_server):
    with _client(embedded_server, embedded_server.api_keys[0]) as client:
        yield client


@pytest.fixture
def other_tenant_client(embedded_server):
    with _client(embedded_server, embedded_server.api_keys[1]) as client:
        yield client
