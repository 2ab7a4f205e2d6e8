"""One `whitney-flows serve` process for the Tinker tests, driven by the official `tinker` SDK
(unmodified) on loopback. Tenant A's key is `tml-`-prefixed as the SDK wants; tenant B's is a
plain server key, which the SDK reaches as `tml-<key>`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.local.served import ServedWhitney, served
from tests.tinker.steps import KEYS, MAX_BODY_BYTES


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWhitney]:
    tmp = tmp_path_factory.mktemp("tinker-served")
    with served(tmp, "--max-body-bytes", str(MAX_BODY_BYTES), keys=KEYS) as process:
        yield process
