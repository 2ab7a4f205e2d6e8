"""Shared fixtures: one embedded Whitney server for the whole test session.

- `embedded_server`: an `EmbeddedWhitney` on a free loopback port with two tenants
  (`api_keys[0]` is `api_key`, `api_keys[1]` another tenant), a temporary data dir;
- `whitney_client`: a `WhitneyClient` on it (fast retries), closed after the test;
- `other_tenant_client`: the same, with the second tenant's key;
- `api`, `other`: raw HTTP clients of it (httpx), one per tenant;
- `hf_models`: a Hugging Face cache holding tiny Llama and Qwen2 checkpoints
  (tests/hfmodels/builders.py), built once, and this environment pointed at it, offline.

The suite runs in two processes (`pytest_xdist_make_scheduler`); `-n 0` runs it in one. Its
controlling process compiles the engine's kernels beside the tests (`pytest_sessionstart`).

Nothing here downloads: HF_HUB_OFFLINE is 1 unless the environment says otherwise. A suite
started in the background (`cmd &` in a script) ignores SIGINT, and every process it starts
would inherit that; the tests that interrupt a child expect SIGINT as a terminal gives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from tests.local.helpers import http
from whitney.local import EmbeddedWhitney

E2E = "tests/e2e/"
"""The end-to-end tests: one process runs them all, on their one stack of servers."""
SERVED_FIRST = ("tests/tinker/test_provider_", "tests/tinker/test_tinker_provider.py")
"""The longest chains of served processes (the Tinker provider's flows, kills and chained flows,
each on servers of its own): first after the end-to-end tests, so no process ends with one."""
COMPILED_LAST = "tests/engine/test_compiled.py"
"""It waits for the compiled kernels: last, when the compile started with the suite is done."""
COMPILE_LOG = Path(__file__).resolve().parents[1] / "test-artifacts" / "engine-compile.log"


def suite_order(item: pytest.Item) -> int:
    nodeid = item.nodeid
    if nodeid.startswith(E2E):
        return 0
    if nodeid.startswith(SERVED_FIRST):
        return 1
    return 3 if nodeid.startswith(COMPILED_LAST) else 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end tests first, then the longest served chains, the compiled kernels' test
    last; every module's tests in their usual order."""
    items.sort(key=suite_order)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Two test processes (pytest-xdist): the end-to-end tests all in one, on their one stack of
    servers; every other module a unit that whichever process is free takes next, in the
    suite's order (`pytest_collection_modifyitems`), so that both end near the same time. A
    scheduler of our own rather than `--dist=loadgroup`, whose groups pytest >= 9.2 silently
    drops (pytest-xdist#1386)."""
    from xdist.scheduler import LoadScopeScheduling

    class EndToEndTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "e2e" if nodeid.startswith(E2E) else super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # the suite's order, not the largest modules first
    return EndToEndTogether(config, log)


def pytest_sessionstart(session: pytest.Session) -> None:
    """The controlling process compiles the engine's kernels into the user's cache beside the
    tests, at their priority (`whitney.local.engine.compile`; an engine run would compile them
    at the lowest, which a busy suite starves): its progress goes to COMPILE_LOG."""
    if hasattr(session.config, "workerinput"):
        return
    COMPILE_LOG.parent.mkdir(exist_ok=True)
    with COMPILE_LOG.open("w") as log:
        compiling = subprocess.Popen(
            [sys.executable, "-m", "whitney.local.engine.compile"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    session.config.stash[COMPILING] = compiling


def pytest_sessionfinish(session: pytest.Session) -> None:
    compiling = session.config.stash.get(COMPILING, None)
    if compiling is not None and compiling.poll() is None:
        compiling.terminate()
        compiling.wait()


COMPILING = pytest.StashKey[subprocess.Popen]()


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


@pytest.fixture(scope="session")
def hf_cache_dir(tmp_path_factory) -> Path:
    """A Hugging Face cache with the tiny Llama 3 and Qwen2 checkpoints (and a GPT-2 config)."""
    from tests.hfmodels.builders import build_cache

    return build_cache(tmp_path_factory.mktemp("hf-cache"))


@pytest.fixture
def hf_models(hf_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache of `hf_cache_dir` as this environment's (HF_HUB_CACHE), offline."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hf_cache_dir
