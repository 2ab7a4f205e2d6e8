"""`Sessions`: sessions, their labels and their leases (a session whose lease runs out is
closed by the reaper, its runs cancelled)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from whitney import wire
from whitney.errors import InvalidRequest, RunNotActive
from whitney.local.api_errors import not_found
from whitney.local.config import ServerConfig
from whitney.local.idempotency import Idempotency
from whitney.local.journal import Journal, session_out
from whitney.local.limits import check_labels
from whitney.local.names import new_id
from whitney.local.workers import Workers

log = logging.getLogger("whitney.local")

REAP_EVERY_S = 5.0
"""The lease reaper looks at least this often (every ttl / 4 for shorter leases)."""


def lease_expiry(ttl_s: float) -> float | None:
    """When a lease of `ttl_s` renewed now ends (a Unix time); None when leases never expire."""
    return time.time() + ttl_s if ttl_s > 0 else None


@dataclass(eq=False, repr=False)
class Sessions:
    """Each tenant's sessions, and the lease reaper's thread."""

    config: ServerConfig
    journal: Journal
    workers: Workers
    idempotency: Idempotency
    _reaper: threading.Thread | None = field(default=None, init=False)

    def start_reaper(self) -> None:
        """Close expired sessions in the background, when sessions have a lease."""
        if self.config.session_ttl_s > 0:
            self._reaper = threading.Thread(
                target=self._reap_expired_leases, name="whitney-lease-reaper", daemon=True
            )
            self._reaper.start()

    def join(self) -> None:
        """Wait for the reaper to stop (the server is closing)."""
        if self._reaper is not None:
            self._reaper.join()

    def create(
        self, tenant: str, body: dict[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]:
        session_id = self.idempotency.create_once(
            tenant, "sessions", wire.SessionCreate, body, idempotency_key, self._insert
        )
        return self.get(tenant, session_id)

    def _insert(self, tenant: str, request: wire.SessionCreate) -> str:
        check_labels(request.labels, self.config.limits)
        session_id = new_id("sess")
        expiry = lease_expiry(self.config.session_ttl_s)
        self.journal.insert_session(session_id, tenant, request.labels, expiry)
        return session_id

    def heartbeat(self, tenant: str, session_id: str) -> dict[str, Any]:
        """Renew an open session's lease; 409 run_not_active for a closed one."""
        session = self.own(tenant, session_id)
        if not self.journal.renew_lease(session_id, lease_expiry(self.config.session_ttl_s)):
            raise RunNotActive(
                f"session {session_id} is closed ({session['closed_reason']}): its lease "
                "cannot be renewed",
                details={"session_id": session_id, "closed_reason": session["closed_reason"]},
            )
        return self.get(tenant, session_id)

    def _reap_expired_leases(self) -> None:
        """Close each session whose lease ran out (its runs cancelled), until shutdown."""
        ttl = self.config.session_ttl_s
        reason = f"lease expired: no heartbeat for {ttl:g} s"
        while not self.workers.closing.wait(min(ttl / 4, REAP_EVERY_S)):
            for session_id in self.journal.expired_sessions(time.time()):
                log.warning(
                    "session %s: %s; closing it and cancelling its runs", session_id, reason
                )
                self.close_for(session_id, reason)

    def own(self, tenant: str, session_id: str) -> dict[str, Any]:
        """The caller's session (404 for another tenant's)."""
        session = self.journal.get_session(session_id)
        if session is None or session["tenant"] != tenant:
            raise not_found("session", session_id)
        return session

    def get(self, tenant: str, session_id: str) -> dict[str, Any]:
        session = self.own(tenant, session_id)
        return session_out(session, self.journal.session_run_ids(session_id))

    def find(self, tenant: str, label_filters: list[str]) -> dict[str, Any]:
        """The tenant's sessions bearing every `KEY:VALUE` label of `label_filters`."""
        pairs: list[tuple[str, str]] = []
        for raw in label_filters:
            key, sep, value = raw.partition(":")
            if not sep or not key:
                raise InvalidRequest(
                    f"label: expected KEY:VALUE, got {raw!r}", details={"field": "label"}
                )
            pairs.append((key, value))
        sessions = self.journal.list_sessions(tenant, pairs)
        return {
            "sessions": [
                session_out(s, self.journal.session_run_ids(s["session_id"])) for s in sessions
            ]
        }

    def close(self, tenant: str, session_id: str) -> dict[str, Any]:
        self.own(tenant, session_id)
        self.close_for(session_id, "closed by the client")
        return self.get(tenant, session_id)

    def close_for(self, session_id: str, reason: str) -> None:
        """Cancel the session's runs that are not terminal, then close it for `reason`."""
        for run_id in self.journal.session_run_ids(session_id):
            run = self.journal.get_run(run_id)
            if run is not None and run["status"] not in wire.RUN_TERMINAL:
                self.workers.cancel(run_id)
        self.journal.close_session(session_id, reason)
