"""Stop between cycles when this flow run is asked to cancel.

Prefect 3.9 leaves a local (not deployed) flow run asked to cancel in Cancelling and lets
its body run to the end; only then does `on_cancellation` fire. The flow therefore watches its
own state, in a daemon thread off the hot path, and stops at the next cycle boundary; the
hook then cancels the Whitney run right away. (A deployed run is killed by its runner, whose
`on_cancellation` does the same.)
"""

from __future__ import annotations

import threading
from uuid import UUID

from prefect import get_client

from flows.core.polling import PollingThread

POLL_INTERVAL_S = 1.0


class CancellationRequested(RuntimeError):
    """The flow run was asked to cancel; raised at a cycle boundary."""


class CancellationWatch(PollingThread):
    """Polls the flow run's state; `raise_if_requested` raises once it is Cancelling."""

    def __init__(self, flow_run_id: UUID, interval_s: float = POLL_INTERVAL_S) -> None:
        super().__init__("cancellation-watch", interval_s)
        self.flow_run_id = flow_run_id
        self._requested = threading.Event()

    def raise_if_requested(self) -> None:
        if self._requested.is_set():
            raise CancellationRequested(f"flow run {self.flow_run_id} was asked to cancel")

    def poll_until_stopped(self) -> None:
        with get_client(sync_client=True) as prefect:
            for _ in self.ticks():
                try:
                    state = prefect.read_flow_run(self.flow_run_id).state
                except Exception:
                    continue
                if state is not None and (state.is_cancelling() or state.is_cancelled()):
                    self._requested.set()
                    return
