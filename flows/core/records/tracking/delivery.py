"""A tracker's calls, delivered in order by a thread of its own, so that the training never
waits on a tracker and a tracker never fails it. No Prefect.

A call that fails (the server down, the network away) is retried, with the calls behind it
held, until it goes through: the first failure of an outage is warned about once, its end
noted, and the outage kept as a `Gap` (when, how many calls were late) for the run's records.
A call the tracker refuses (an HTTP 4xx) is warned about and dropped. When the flow run ends,
what is still undelivered after `FINISH_WAIT_S` is given up and recorded as lost. An error is
shown with every URL's user and password cut out (`params.without_credentials`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from flows.core.records.tracking.backend import Tracker
from flows.core.records.tracking.params import without_credentials

RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 15.0)
"""The waits between attempts at a failing call (the last one repeats)."""
FINISH_WAIT_S = 60.0
"""How long the end of a flow run waits for its trackers' undelivered calls."""

ERROR_CHARS = 200
"""How much of a failure a gap keeps."""

Call = Callable[[Tracker], None]


def shown(error: Exception) -> str:
    """An error as the warnings and the gaps show it: its repr, redacted."""
    return without_credentials(repr(error))


@dataclass
class Gap:
    """A time a tracker could not be reached: from `started` to `ended` (None: not yet back;
    wall-clock seconds), the first error, the calls it held back, those never delivered."""

    started: float
    error: str
    """The first failure, shortened (MLflow's run long)."""
    ended: float | None = None
    late: int = 0
    lost: list[str] = field(default_factory=list)


def finish_deadline() -> float:
    """When (time.monotonic) the end of a flow run stops waiting for its trackers."""
    return time.monotonic() + FINISH_WAIT_S


def refused(error: Exception) -> bool:
    """Whether the tracker answered and refused the call (an HTTP 4xx, as MLflow reports it):
    trying again would not help."""
    status = getattr(error, "get_http_status_code", None)
    return callable(status) and 400 <= status() < 500


class Delivery:
    """The calls to one tracker, started by `start` (retried like any call), in order."""

    def __init__(
        self, name: str, start: Callable[[], Tracker], report: Callable[[int, str], None]
    ) -> None:
        self.name = name
        self.start = start
        self.report = report
        """(logging level, message): where the warnings go (the flow run's log)."""
        self.tracker: Tracker | None = None
        self.gaps: list[Gap] = []
        self.dropped: list[str] = []
        """The calls the tracker refused."""
        self.pending: deque[tuple[str, Call]] = deque()
        self.changed = threading.Condition()
        self.closing = False
        self.given_up = False
        self.thread = threading.Thread(target=self.deliver, name=f"tracking-{name}", daemon=True)
        self.thread.start()

    def submit(self, what: str, call: Call) -> None:
        """Queue `call` (named `what` in warnings and records)."""
        with self.changed:
            self.pending.append((what, call))
            self.changed.notify_all()

    def deliver(self) -> None:
        """The thread: each call in turn, until closed and empty, or given up."""
        while True:
            with self.changed:
                while not self.pending and not self.closing:
                    self.changed.wait()
                if not self.pending or self.given_up:
                    return
                what, call = self.pending[0]
            if self.attempt(what, call):
                with self.changed:
                    self.pending.popleft()
                    self.changed.notify_all()

    def attempt(self, what: str, call: Call) -> bool:
        """Deliver one call, retrying while it fails; False if given up meanwhile."""
        failures = 0
        while True:
            try:
                if self.tracker is None:
                    self.tracker = self.start()
                call(self.tracker)
            except Exception as error:
                if refused(error) and self.tracker is not None:
                    message = f"{self.name} refused the {what}, which is dropped: {shown(error)}"
                    self.report(logging.WARNING, message)
                    self.dropped.append(what)
                    return True
                if failures == 0:
                    self.outage(what, error)
                delay = RETRY_DELAYS_S[min(failures, len(RETRY_DELAYS_S) - 1)]
                failures += 1
                with self.changed:
                    self.changed.wait_for(lambda: self.given_up, timeout=delay)
                    if self.given_up:
                        return False
                continue
            if failures and self.gaps[-1].ended is None:
                with self.changed:
                    self.gaps[-1].late = len(self.pending)  # this call and those behind it
                self.gaps[-1].ended = time.time()
                self.report(logging.INFO, f"{self.name} is back: the calls it held go through")
            return True

    def outage(self, what: str, error: Exception) -> None:
        """The first failure of a call: a new gap, warned about once, unless one is open."""
        if self.gaps and self.gaps[-1].ended is None:
            return
        self.gaps.append(Gap(started=time.time(), error=shown(error)[:ERROR_CHARS]))
        self.report(
            logging.WARNING,
            f"{self.name} cannot take the {what} ({shown(error)}): the training goes on; this and "
            "the later calls wait and are retried, and the gap goes into the run's records",
        )

    def close(self, deadline: float) -> list[str]:
        """Wait until `deadline` (time.monotonic) for the undelivered calls; give up on the
        rest (recorded in the last gap) and return what they were."""
        with self.changed:
            self.closing = True
            self.changed.notify_all()
            self.changed.wait_for(lambda: not self.pending, timeout=deadline - time.monotonic())
            lost = [what for what, _ in self.pending]
            if lost:
                self.given_up = True
                if not self.gaps or self.gaps[-1].ended is not None:
                    self.gaps.append(Gap(started=time.time(), error="too slow to answer"))
                self.gaps[-1].lost = lost
                self.changed.notify_all()
        return lost
