"""Session leases, the client's side: a background thread that renews the lease of every
session a client opened (`POST /v1/sessions/{id}/heartbeat`) every third of the server's
`session_ttl_s`, for as long as the client holds it. A process that dies stops renewing, and
the server closes its sessions and cancels their runs once the lease runs out."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from whitney.errors import NotFound, RunNotActive

logger = logging.getLogger("whitney.leases")


class LeaseKeeper:
    """Renews the held sessions' leases by `renew(session_id)` every `interval_s` seconds."""

    def __init__(self, renew: Callable[[str], object], interval_s: float) -> None:
        self._renew = renew
        self._interval_s = interval_s
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, session_id: str) -> None:
        """Keep `session_id`'s lease from now on (the thread starts with the first one)."""
        with self._lock:
            self._held.add(session_id)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="whitney-lease-keeper", daemon=True
                )
                self._thread.start()

    def release(self, session_id: str) -> None:
        with self._lock:
            self._held.discard(session_id)

    def held(self) -> set[str]:
        with self._lock:
            return set(self._held)

    def stop(self) -> None:
        """Renew nothing more; the thread ends (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._interval_s + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            for session_id in self.held():
                self._renew_one(session_id)

    def _renew_one(self, session_id: str) -> None:
        try:
            self._renew(session_id)
        except (RunNotActive, NotFound):
            self.release(session_id)  # closed, by the client or by an expired lease
        except Exception as error:  # the thread must outlive any one failure
            logger.warning("renewing the lease of session %s failed: %r", session_id, error)
