"""Fixtures of the server tests: raw HTTP clients of the shared embedded server, one per
tenant."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from whitney.local import EmbeddedWhitney

from .helpers import http


@pytest.fixture
def api(embedded_server: EmbeddedWhitney) -> Iterator[httpx.Client]:
    """Tenant A's client."""
    with http(embedded_server) as client:
        yield client


@pytest.fixture
def other(embedded_server: EmbeddedWhitney) -> Iterator[httpx.Client]:
    """Tenant B's client."""
    with http(embedded_server, embedded_server.api_keys[1]) as client:
        yield client
