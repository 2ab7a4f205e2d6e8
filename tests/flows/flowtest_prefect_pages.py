"""A Prefect API of a test module's own whose page, when a read names no limit, is a few runs
(PREFECT_SERVER_API_DEFAULT_LIMIT, 200 unless set): more than a page is then a few runs, not
hundreds: a server of tests/prefect_server.py, on SQLite as the session's harness; the flows'
reads find it in PREFECT_API_URL."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.utilities.asyncutils import run_coro_as_sync

from tests.prefect_server import prefect_server


@contextmanager
def prefect_api_with_page(page: int, directory: Path) -> Iterator[None]:
    """A Prefect server (its home and log in `directory`) whose page is `page` runs, this
    process's PREFECT_API_URL until the block ends."""
    page_setting = {"PREFECT_SERVER_API_DEFAULT_LIMIT": str(page)}
    with (
        prefect_server(directory, page_setting) as api_url,
        temporary_settings(updates={PREFECT_API_URL: api_url}),
    ):
        try:
            yield
        finally:
            run_coro_as_sync(drain_workers())


async def drain_workers() -> None:
    """Send what this process's log and event workers still hold to the server before it stops,
    as `prefect_test_harness` does: else they retry a stopped server for the rest of the process
    (a later test in it timed out, another read their errors in its stderr)."""
    try:
        drained = APILogWorker.instance().drain()
        if inspect.isawaitable(drained):
            await drained
    except RuntimeError:  # never started
        pass
    drained = EventsWorker.drain_all()
    if inspect.isawaitable(drained):
        await drained


def assert_more_than_a_page(prefect: SyncPrefectClient, runs: list[FlowRun], page: int) -> None:
    """A read of `runs` that names no limit answers one page, not all of them."""
    answered = prefect.read_flow_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id for run in runs]))
    )
    assert len(runs) > page and len(answered) == page
