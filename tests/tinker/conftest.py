"""One `whitney-flows serve` process for the Tinker tests, driven by the official `tinker` SDK
(unmodified) on loopback. Tenant A's key is `tml-`-prefixed as the SDK wants; tenant B's is a
plain server key, which the SDK reaches as `tml-<key>`. The provider's flow tests share one
Prefect server (`prefect_api`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.local.served import ServedWhitney, served
from tests.prefect_server import prefect_server
from tests.tinker.steps import KEYS, MAX_BODY_BYTES


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWhitney]:
    tmp = tmp_path_factory.mktemp("tinker-served")
    with served(tmp, "--max-body-bytes", str(MAX_BODY_BYTES), keys=KEYS) as process:
        yield process


@pytest.fixture(scope="package")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prefect server (SQLite) for the flow tests' `whitney-flows` processes: its API URL,
    their PREFECT_API_URL."""
    with prefect_server(tmp_path_factory.mktemp("tinker-prefect")) as api_url:
        yield api_url
