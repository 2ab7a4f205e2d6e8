"""`Takeover`: a starting server takes over the runs an earlier process left active.

A run being cancelled ends cancelled, one being allocated ends failed, and every ready or
finishing one is rebuilt from its journal in the background (`whitney.local.recovery`),
answering 503 `unavailable` with Retry-After until it is (`whitney.local.workers`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whitney.errors import InternalError, WhitneyError
from whitney.local.api_errors import error_object
from whitney.local.executor import RunWorker
from whitney.local.files import RunFiles
from whitney.local.journal import Journal
from whitney.local.runs import load_engine
from whitney.local.workers import Workers

log = logging.getLogger("whitney.local")

RESTART_CANCELLED = {
    "type": "cancelled",
    "message": "the run was being cancelled when the server restarted",
    "details": {},
}


@dataclass(eq=False, repr=False)
class Takeover:
    """Ends or rebuilds the runs left active, oldest first, on its own thread."""

    journal: Journal
    workers: Workers
    files: RunFiles
    new_worker: Callable[[dict[str, Any], Any, int], RunWorker]
    hf_cache: Path | None
    _thread: threading.Thread | None = field(default=None, init=False)

    def start(self) -> None:
        """End what cannot be rebuilt; start rebuilding the rest in the background."""
        for run in self.journal.active_runs():
            run_id = run["run_id"]
            if run["status"] == "cancelling":
                self.journal.end_unrecoverable(run_id, "cancelled", RESTART_CANCELLED)
            elif run["status"] == "allocating":
                error = InternalError("the server restarted while the run was being allocated")
                self.journal.end_unrecoverable(run_id, "failed", error_object(error))
            else:
                for orphan in self.journal.requeue_interrupted(run_id):
                    Path(orphan).unlink(missing_ok=True)
                self.workers.recovering[run_id] = run
        if self.workers.recovering:
            self._thread = threading.Thread(
                target=self._recover_runs, name="whitney-recovery", daemon=True
            )
            self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _recover_runs(self) -> None:
        """Rebuild each run left active, oldest first, and start its worker."""
        from whitney.local import recovery

        closing = self.workers.closing
        for run_id, run in list(self.workers.recovering.items()):
            if closing.is_set():
                return  # left active in the journal: the next start rebuilds it
            started = time.monotonic()
            try:
                rebuilt = recovery.rebuild(
                    run,
                    self.journal.replay_rows(run_id),
                    load_engine(),
                    self.files,
                    closing,
                    self.hf_cache,
                )
            except Exception as exc:
                if closing.is_set():
                    return
                log.exception("run %s: rebuilding it after the restart failed", run_id)
                reason = exc.message if isinstance(exc, WhitneyError) else type(exc).__name__
                error = InternalError(
                    f"the server restarted and could not rebuild the run: {reason}",
                    details={"run_id": run_id},
                )
                self.journal.end_unrecoverable(run_id, "failed", error_object(error))
                self.workers.given_up(run_id)
                continue
            worker = self.new_worker(run, rebuilt.engine, rebuilt.frontier)
            worker.resume(rebuilt.tickets, rebuilt.terminal_ahead, rebuilt.samplers)
            if not self.workers.add(run_id, worker):
                return
            worker.start()
            log.warning(
                "run %s rebuilt after the restart in %.2f s (from %s, %d operations replayed, "
                "%d queued again)",
                run_id,
                time.monotonic() - started,
                "its creation"
                if rebuilt.base_seq_id is None
                else f"its checkpoint at seq_id {rebuilt.base_seq_id}",
                rebuilt.replayed,
                len(rebuilt.tickets),
            )
            if self.journal.get_session(run["session_id"])["status"] != "open":
                self.workers.cancel(run_id)  # its session closed (or its lease ran out) meanwhile
