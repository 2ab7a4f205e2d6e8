"""`Workers`: the ordered worker of each active run, and the runs still being rebuilt after a
restart (answered 503 `unavailable` with Retry-After until they are)."""

from __future__ import annotations

import threading
from typing import Any

from whitney.errors import Unavailable
from whitney.local.executor import RunWorker

RECOVERY_RETRY_AFTER_S = 1.0
"""Retry-After of a 503 for a run being rebuilt after a restart."""


def rebuilding(run_id: str) -> Unavailable:
    """The refusal of a call on a run being rebuilt."""
    return Unavailable(
        f"run {run_id} is being rebuilt after a server restart; retry shortly",
        details={"run_id": run_id},
        retry_after=RECOVERY_RETRY_AFTER_S,
    )


class Workers:
    """The active runs' workers by run id; `closing` is set once the server stops."""

    def __init__(self, post_wait_s: float) -> None:
        self.post_wait_s = post_wait_s
        self.closing = threading.Event()
        self.recovering: dict[str, dict[str, Any]] = {}  # run_id -> run, until rebuilt
        self._workers: dict[str, RunWorker] = {}
        self._lock = threading.Lock()

    def get(self, run_id: str) -> RunWorker | None:
        with self._lock:
            return self._workers.get(run_id)

    def get_or_rebuilding(self, run_id: str) -> tuple[RunWorker | None, bool]:
        """The run's worker, and whether it is being rebuilt (read together)."""
        with self._lock:
            return self._workers.get(run_id), run_id in self.recovering

    def refuse_while_recovering(self, run_id: str) -> None:
        if run_id in self.recovering:
            raise rebuilding(run_id)

    def add(self, run_id: str, worker: RunWorker) -> bool:
        """Register the run's worker (new, or rebuilt: the run is no longer recovering);
        False, registering nothing, once the server is closing."""
        with self._lock:
            if self.closing.is_set():
                return False
            self._workers[run_id] = worker
            self.recovering.pop(run_id, None)
        return True

    def given_up(self, run_id: str) -> None:
        """The run could not be rebuilt: it is no longer recovering."""
        with self._lock:
            self.recovering.pop(run_id, None)

    def exited(self, run_id: str) -> None:
        """A worker's `on_exit`."""
        with self._lock:
            self._workers.pop(run_id, None)

    def finish(self, run_id: str) -> None:
        """Let an active run drain its queue, waiting up to `post_wait_s` for it."""
        worker = self.get(run_id)
        if worker is not None:
            worker.finish()
            worker.wait_exit(self.post_wait_s)

    def cancel(self, run_id: str) -> None:
        """Cancel an active run, waiting up to `post_wait_s` for its worker to stop."""
        worker = self.get(run_id)
        if worker is not None:
            worker.cancel()
            worker.wait_exit(self.post_wait_s)

    def wake_waiters(self) -> None:
        """Server stopping: wake every long-poll so it answers now."""
        self.closing.set()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            with worker.cond:
                for ticket in worker.tickets.values():
                    ticket.done.set()

    def stop(self) -> None:
        """Stop every worker (the running operation completes)."""
        self.closing.set()
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            worker.stop()
