"""Riding out the orchestrator's outages: a training flow keeps going while the Prefect API is
away, and says so once, plainly.

What rides through by Prefect's own means (Prefect 3.9.1, `prefect/client/base.py`): a client
that has reached the API once retries a request that failed on a transport error (ConnectError
included) or answered 408/429/502/503 (and PREFECT_CLIENT_RETRY_EXTRA_CODES)
PREFECT_CLIENT_MAX_RETRIES times (default 5), waiting 2, 4, 8, 16, 32 s (+/- the
PREFECT_CLIENT_RETRY_JITTER_FACTOR, 0.2): about 62 s. A new client (each subflow run's engine
opens one) does not retry ConnectError at all: "fail fast on a wrong URL". Tasks report by
events, which the events worker sends over a websocket; those emitted while the API is away
are lost, with an error line for each.

What this module adds: while the cycles run, a health check of the API every WATCH_S
seconds (`watch_health`), so the run says when Prefect goes and comes back even while
Prefect's clients are silently retrying; and around the calls of the cycle loop
(`ride_out`): a call that fails
while the API does not answer its health check waits for it (polling /health every
POLL_S seconds, at most `WHITNEY_FLOWS_PREFECT_OUTAGE_S`, default 600 s) and is made again.
A cycle subflow made again replays its seq ids from the Whitney journal, so it trains
nothing twice. Past the bound the call raises `PrefectAway`, an infrastructure error that the
automatic resume (flows.resume) picks up. The subflow run the outage interrupted (left Running
or Pending: its final state never reached the API) is marked Crashed before the call is made
again (`crash_open_subflows`), so no flow run stays open. A logging filter
(`PrefectAwayNotice`) replaces Prefect's errors of the outage (the events worker's and log
shipper's per-item errors, a subflow's ConnectError traceback) by one line when it starts and
one when it ends.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx
from prefect import get_client
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.client.schemas.sorting import FlowRunSort
from prefect.context import FlowRunContext
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed

from flows.core.orchestration.paging import every_page

T = TypeVar("T")
OUTAGE_ENV = "WHITNEY_FLOWS_PREFECT_OUTAGE_S"
DEFAULT_OUTAGE_S = 600.0
POLL_S = 1.0
WATCH_S = 5.0
"""How often the flow checks the API's health while its cycles run."""
WATCH_FAILURES = 3
"""Checks in a row without an answer that make an outage (a busy server answers late)."""
NOISY_LOGGERS = (
    "prefect._internal.concurrency",  # "Service 'EventsWorker' failed to process item ..."
    "prefect.events.clients",  # "Unable to connect to ... event data may be lost"
    "prefect.events.worker",
    "prefect.flow_runs",  # a subflow's "Encountered exception during execution: ConnectError"
)
"""The loggers whose records during an outage become the one notice."""
OUTAGE_LINE = re.compile(r"failed to process|failed with|Unable to connect")
"""Their lines that say the API is unreachable (services.py, events/clients.py)."""
OWN_LINES = ("Prefect is away", "Prefect is back")

logger = logging.getLogger("whitney_flows.orchestrator")


class PrefectAway(RuntimeError):
    """The Prefect API stayed unreachable longer than the flow run waits for it."""


def outage_bound_s() -> float:
    """How long a flow run waits for the Prefect API (WHITNEY_FLOWS_PREFECT_OUTAGE_S)."""
    return float(os.environ.get(OUTAGE_ENV) or DEFAULT_OUTAGE_S)


def api_healthy(api_url: str | None = None, timeout_s: float = 2.0) -> bool:
    """Whether the Prefect API answers its health check (no API URL: an ephemeral one, up)."""
    url = api_url if api_url is not None else PREFECT_API_URL.value()
    if not url:
        return True
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def unreachable_api(exc_info: Any, api_url: str | None) -> bool:
    """Whether a log record's exception is (or was caused by) a transport error on a request
    to the Prefect API."""
    error = exc_info[1] if isinstance(exc_info, tuple) else None
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, httpx.TransportError) and api_url:
            try:
                return str(error.request.url).startswith(api_url)
            except RuntimeError:  # no request attached
                return False
        error = error.__cause__ or error.__context__
    return False


class PrefectAwayNotice(logging.Filter):
    """Drops Prefect's own error lines while the API is away; says once that it is away
    (`away`), and once that it is back (`back`), with how long it was gone."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__()
        self.say = say
        self.api_url: str | None = PREFECT_API_URL.value()
        """Read where the notice is made: Prefect's settings context is not a thread's."""
        self.since: float | None = None
        self.dropped = 0
        self._raise_exceptions = logging.raiseExceptions
        self._lock = threading.RLock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if message.startswith(OWN_LINES):
            return True
        if not OUTAGE_LINE.search(message) and not unreachable_api(record.exc_info, self.api_url):
            return True
        self.away(message.split(". ", 1)[0])
        self.dropped += 1
        return False

    def away(self, what: str) -> None:
        with self._lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
            self._raise_exceptions = logging.raiseExceptions
            logging.raiseExceptions = False  # the log shipper's "--- Error logging to API ---"
            self.say(
                f"Prefect is away ({self.api_url}: {what}); training goes on and "
                f"waits for it up to {outage_bound_s():g} s where it must"
            )

    def back(self) -> None:
        with self._lock:
            if self.since is None:
                return
            gone = time.monotonic() - self.since
            self.say(f"Prefect is back after {gone:.0f} s ({self.dropped} of its errors hidden)")
            self.since, self.dropped = None, 0
            logging.raiseExceptions = self._raise_exceptions

    def check_back(self) -> None:
        """`back` if an outage was noticed and the API answers again."""
        if self.since is not None and api_healthy(self.api_url):
            self.back()


def watch_health(notice: PrefectAwayNotice, stop: threading.Event) -> None:
    """Every WATCH_S seconds, the API's health: `away` after WATCH_FAILURES failed checks in
    a row, `back` once it answers again (while Prefect's own clients may still be retrying)."""
    failed = 0
    while not stop.wait(WATCH_S):
        if api_healthy(notice.api_url, timeout_s=WATCH_S):
            failed = 0
            notice.check_back()
            continue
        failed += 1
        if failed >= WATCH_FAILURES:
            notice.away("no answer to its health check")


@contextmanager
def prefect_away_notice(say: Callable[[str], None]) -> Iterator[PrefectAwayNotice]:
    """Within the block, Prefect's outage errors become `say`'s two lines, said as soon as a
    health check or an error shows the API away and again when it answers."""
    notice = PrefectAwayNotice(say)
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    for each in loggers:
        each.addFilter(notice)
    stop = threading.Event()
    watcher = threading.Thread(
        target=watch_health, args=(notice, stop), name="prefect-health", daemon=True
    )
    if notice.api_url:
        watcher.start()
    try:
        yield notice
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(timeout=5)
        for each in loggers:
            each.removeFilter(notice)
        logging.raiseExceptions = notice._raise_exceptions


def wait_for_api(notice: PrefectAwayNotice, bound_s: float) -> None:
    """Poll the API's health until it answers (then `notice.back()`); PrefectAway after
    `bound_s` seconds."""
    deadline = time.monotonic() + bound_s
    while not api_healthy(notice.api_url):
        if time.monotonic() >= deadline:
            raise PrefectAway(
                f"the Prefect API ({notice.api_url}) did not answer for {bound_s:g} s "
                f"({OUTAGE_ENV})"
            )
        time.sleep(POLL_S)
    notice.back()


def ride_out(call: Callable[[], T], notice: PrefectAwayNotice, what: str) -> T:
    """`call()`; if it fails while the Prefect API is away (whatever it raised: a transport
    error, or the engine's own error after failing to record a state), wait for the API
    (bounded) and call again. A failure while the API answers is the call's own: raised as
    it is."""
    deadline = time.monotonic() + outage_bound_s()
    while True:
        try:
            result = call()
        except Exception as error:  # the engine may wrap a transport error in its own
            if api_healthy(notice.api_url):
                raise
            notice.away(f"{what}: {type(error).__name__}")
            wait_for_api(notice, max(deadline - time.monotonic(), 0.0))
            crash_interrupted_subflows()
            continue
        notice.check_back()
        return result


def crash_open_subflows(prefect: SyncPrefectClient, parent_id: Any, why: str) -> list[str]:
    """Mark Crashed (with `why`) every subflow run of `parent_id`, and theirs, not in a final
    state: runs whose process or API went away under them. Their names."""
    children = every_page(
        lambda offset: prefect.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])
            ),
            sort=FlowRunSort.ID_DESC,
            offset=offset,
        )
    )
    names: list[str] = []
    for child in children:
        if child.state is not None and child.state.is_final():
            continue
        names += crash_open_subflows(prefect, child.id, why)
        prefect.set_flow_run_state(child.id, Crashed(message=why), force=True)
        names.append(child.name)
    return names


def crash_interrupted_subflows() -> None:
    """After an outage, inside a flow run: its subflow runs the outage left open, Crashed."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    try:
        with get_client(sync_client=True) as prefect:
            crashed = crash_open_subflows(
                prefect,
                context.flow_run.id,
                "interrupted by a Prefect API outage; its parent made it again "
                "(flows/core/orchestration/orchestrator.py)",
            )
    except Exception as error:  # the API went away again: the call below meets it
        logger.warning("Could not close the subflow runs the outage interrupted: %r", error)
        return
    if crashed:
        logger.info("Marked Crashed after the outage: %s", ", ".join(crashed))
