"""The Whitney service behind the HTTP app: its parts, wired together, and what spans them.

Each part holds one thing: `Sessions` (sessions and their leases), `Runs` (runs, their engines
and workers), `Operations` (operations journaled and read back, admitted by `Admission`),
`RunFiles` (the disk layout and what a checkpoint URI names), `ServedModels` (the models
the OpenAI-compatible routes sample), `Workers` (the active runs'
workers), `Ownership` (the data directory's lock, held while the service lives) and
`Takeover` (the runs an earlier, dead, owner left active). Everything is plain Python
called from worker threads (but `Operations.wait`, awaited on the HTTP layer's event loop so
that a long-poll holds no thread); every refusal raises the `whitney.errors` class of its
docs/api.md error type. The HTTP layer (`app.py`) only parses, authenticates and serialises
(refusals included).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import Any

from whitney.errors import Unauthorized
from whitney.local import hf_models, providers
from whitney.local.admission import Admission
from whitney.local.capture import Capture
from whitney.local.config import ServerConfig
from whitney.local.faults import FaultInjector
from whitney.local.files import RunFiles
from whitney.local.idempotency import Idempotency
from whitney.local.journal import Journal
from whitney.local.operations import Operations
from whitney.local.ownership import Ownership
from whitney.local.runs import Runs, engine_module, load_engine, max_lora_rank
from whitney.local.served_models import ServedModels
from whitney.local.sessions import Sessions, lease_expiry
from whitney.local.takeover import Takeover
from whitney.local.workers import Workers

log = logging.getLogger("whitney.local")


def tenant_of(api_key: str) -> str:
    """The tenant an API key speaks for: a digest, so no key is ever stored or logged."""
    return hashlib.sha256(b"whitney-tenant:" + api_key.encode()).hexdigest()[:32]


class WhitneyService:
    """The embedded Whitney: journal-first, one ordered worker per active run."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ownership = Ownership(self.data_dir)  # before the journal: no live owner's runs
        try:
            self.journal = Journal(self.data_dir / "journal.sqlite3")
            self.journal.renew_open_leases(lease_expiry(config.session_ttl_s))
        except BaseException:
            self.ownership.release()
            raise
        self.faults = FaultInjector(
            latency_ms=config.latency_ms,
            fail_before_rate=config.fail_before_rate,
            drop_after_commit_rate=config.drop_after_commit_rate,
            seed=config.fault_seed,
        )
        self._tenant_by_digest = {
            hashlib.sha256(key.encode()).digest(): tenant_of(key) for key in config.api_keys
        }
        self.workers = Workers(config.post_wait_s)
        self.files = RunFiles(self.data_dir, self.journal)
        idempotency = Idempotency(self.journal)
        self.sessions = Sessions(config, self.journal, self.workers, idempotency)
        self.runs = Runs(config, self.journal, self.workers, self.files, self.sessions, idempotency)
        admission = Admission(config, self.journal, self.files, self.workers)
        self.operations = Operations(config, self.journal, self.workers, self.runs, admission)
        self.models = ServedModels(config, self.journal, self.files)
        self.capture = None if config.capture is None else Capture(config.capture)
        self._preload: threading.Thread | None = None
        self._takeover = Takeover(
            self.journal, self.workers, self.files, self.runs.new_worker, config.hf_cache
        )
        self._takeover.start()
        self.sessions.start_reaper()

    def preload_engine(self) -> None:
        """Import the engine (torch) in the background so the first run does not wait for it."""

        def load() -> None:
            try:
                engine_module()
            except Exception:  # reported when a run is created
                log.debug("engine preload failed", exc_info=True)

        self._preload = threading.Thread(target=load, name="whitney-engine-preload", daemon=True)
        self._preload.start()

    def shutdown(self) -> None:
        """Stop every worker (the running operation completes), close the journal, then let
        another server own the data directory."""
        self.workers.stop()
        if self._preload is not None:
            self._preload.join()
        self.sessions.join()
        self._takeover.join()
        self.journal.close()
        self.ownership.release()

    def wake_waiters(self) -> None:
        """Server stopping: wake every long-poll so it answers now."""
        self.workers.wake_waiters()

    def authenticate(self, authorization: str | None) -> str:
        """The tenant of a `Bearer <api key>` Authorization header."""
        if not authorization:
            raise Unauthorized("missing Authorization: Bearer <api key> header")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("the Authorization header must be 'Bearer <api key>'")
        tenant = self._tenant_by_digest.get(hashlib.sha256(token.encode()).digest())
        if tenant is None:
            raise Unauthorized("invalid API key")
        return tenant

    def capabilities(self) -> dict[str, Any]:
        engine = load_engine()
        base_models = [*engine.BASE_MODELS, *hf_models.served_repo_ids(self.config.hf_cache)]
        return providers.capabilities(
            base_models, max_lora_rank(engine), self.config.limits, self.config.session_ttl_s
        )
