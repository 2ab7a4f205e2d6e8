"""The Whitney service behind the HTTP app: sessions, runs, operations, artifacts.

Everything here is plain Python called from worker threads (but `wait`, awaited on the HTTP
layer's event loop so that a long-poll holds no thread); every refusal raises the
`whitney.errors` class of its docs/api.md error type. The HTTP layer (`app.py`) only parses,
authenticates and serialises (refusals included).
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from whitney import hf_cache, wire
from whitney.errors import (
    IdempotencyConflict,
    InternalError,
    InvalidRequest,
    NotFound,
    RunNotActive,
    SeqConflict,
    Unauthorized,
    Unavailable,
    UnsupportedBaseModel,
    WhitneyError,
)
from whitney.local import hf_models, providers
from whitney.local.api_errors import error_object, from_validation_error, not_found
from whitney.local.config import MAX_WAIT_S, ServerConfig
from whitney.local.executor import (
    RunWorker,
    Ticket,
    default_sampler_id,
    default_state_name,
)
from whitney.local.fairness import wait_event
from whitney.local.faults import FaultInjector
from whitney.local.journal import (
    Journal,
    canonical_hash,
    canonical_json,
    render_operation,
)
from whitney.local.limits import check_labels, check_payload, check_pending, check_seq_window
from whitney.uris import checkpoint_uri, split_checkpoint

log = logging.getLogger("whitney.local")

_RequestT = TypeVar("_RequestT", bound=wire.RequestModel)

NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
DEFAULT_MAX_LORA_RANK = 64
MAX_LIST_LIMIT = 1000
REAP_EVERY_S = 5.0
"""The lease reaper looks at least this often (every ttl / 4 for shorter leases)."""
DEFAULT_LIST_LIMIT = 100
RECOVERY_RETRY_AFTER_S = 1.0
"""Retry-After of a 503 for a run being rebuilt after a restart."""
RESTART_CANCELLED = {
    "type": "cancelled",
    "message": "the run was being cancelled when the server restarted",
    "details": {},
}
RUN_TERMINAL = wire.RUN_TERMINAL
OP_TERMINAL = wire.OPERATION_TERMINAL
HF_PREFIX = "hf:"  # `hf:<repo id>` base models go to the engine, which loads them offline


@dataclass(frozen=True)
class RawJson:
    """An answer already serialised (operations: the journal's JSON texts spliced together)."""

    text: str


@dataclass(frozen=True)
class Waiting:
    """An operation answer to give once `ticket` is done or `timeout_s` has passed: the HTTP
    layer awaits `WhitneyService.wait(...)`, then `render_waited(...)`."""

    run_id: str
    seq_id: int
    ticket: Ticket
    timeout_s: float


def tenant_of(api_key: str) -> str:
    """The tenant an API key speaks for: a digest, so no key is ever stored or logged."""
    return hashlib.sha256(b"whitney-tenant:" + api_key.encode()).hexdigest()[:32]


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


def _valid_name(name: str) -> bool:
    return bool(NAME.match(name)) and name not in (".", "..")


def _journaled_before(worker: RunWorker, seq_id: int) -> bool:
    """Whether every seq_id of the worker's run before `seq_id` is journaled (the caller
    holds `worker.cond`): below the frontier all are; past it, pending or terminal ones."""
    known = worker.tickets.keys() | worker.terminal_ahead
    return all(seq in known for seq in range(worker.frontier, seq_id))


def _engine_module() -> Any:
    from whitney.local import engine  # torch: imported on first use, preloaded at start

    return engine


class WhitneyService:
    """The embedded Whitney: journal-first, one ordered worker per active run."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "runs").mkdir(exist_ok=True)
        (self.data_dir / "artifacts").mkdir(exist_ok=True)
        self.journal = Journal(self.data_dir / "journal.sqlite3")
        self.journal.renew_open_leases(self._lease_expiry())
        self.faults = FaultInjector(
            latency_ms=config.latency_ms,
            fail_before_rate=config.fail_before_rate,
            drop_after_commit_rate=config.drop_after_commit_rate,
            seed=config.fault_seed,
        )
        self._tenant_by_digest = {
            hashlib.sha256(key.encode()).digest(): tenant_of(key) for key in config.api_keys
        }
        self._workers: dict[str, RunWorker] = {}
        self._workers_lock = threading.Lock()
        self._idempotency_lock = threading.Lock()
        self._closing = threading.Event()
        self._preload: threading.Thread | None = None
        self._reaper: threading.Thread | None = None
        self._recovering: dict[str, dict[str, Any]] = {}  # run_id -> run, until rebuilt
        self._recovery: threading.Thread | None = None
        self._start_recovery()
        if config.session_ttl_s > 0:
            self._reaper = threading.Thread(
                target=self._reap_expired_leases, name="whitney-lease-reaper", daemon=True
            )
            self._reaper.start()

    # ------------------------------------------------------------------ lifecycle

    def preload_engine(self) -> None:
        """Import the engine (torch) in the background so the first run does not wait for it."""

        def load() -> None:
            try:
                _engine_module()
            except Exception:  # reported when a run is created
                log.debug("engine preload failed", exc_info=True)

        self._preload = threading.Thread(target=load, name="whitney-engine-preload", daemon=True)
        self._preload.start()

    def shutdown(self) -> None:
        """Stop every worker (the running operation completes), then close the journal."""
        self._closing.set()
        with self._workers_lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            worker.stop()
        for thread in (self._preload, self._reaper, self._recovery):
            if thread is not None:
                thread.join()
        self.journal.close()

    def wake_waiters(self) -> None:
        """Server stopping: wake every long-poll so it answers now."""
        self._closing.set()
        with self._workers_lock:
            workers = list(self._workers.values())
        for worker in workers:
            with worker.cond:
                for ticket in worker.tickets.values():
                    ticket.done.set()

    # ------------------------------------------------------------------ recovery

    def _start_recovery(self) -> None:
        """Take over the runs an earlier process left active: a run being cancelled ends
        cancelled, one being allocated ends failed, and every ready or finishing one is rebuilt
        from its journal in the background (`whitney.local.recovery`), answering 503
        `unavailable` with Retry-After until it is."""
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
                self._recovering[run_id] = run
        if self._recovering:
            self._recovery = threading.Thread(
                target=self._recover_runs, name="whitney-recovery", daemon=True
            )
            self._recovery.start()

    def _recover_runs(self) -> None:
        """Rebuild each run left active, oldest first, and start its worker."""
        from whitney.local import recovery

        for run_id, run in list(self._recovering.items()):
            if self._closing.is_set():
                return  # left active in the journal: the next start rebuilds it
            started = time.monotonic()
            try:
                rebuilt = recovery.rebuild(
                    run,
                    self.journal.replay_rows(run_id),
                    self._engine(),
                    self,
                    self._closing,
                    self.config.hf_cache,
                )
            except Exception as exc:
                if self._closing.is_set():
                    return
                log.exception("run %s: rebuilding it after the restart failed", run_id)
                reason = exc.message if isinstance(exc, WhitneyError) else type(exc).__name__
                error = InternalError(
                    f"the server restarted and could not rebuild the run: {reason}",
                    details={"run_id": run_id},
                )
                self.journal.end_unrecoverable(run_id, "failed", error_object(error))
                with self._workers_lock:
                    self._recovering.pop(run_id, None)
                continue
            worker = self._new_worker(run, rebuilt.engine, rebuilt.frontier)
            worker.resume(rebuilt.tickets, rebuilt.terminal_ahead, rebuilt.samplers)
            with self._workers_lock:
                if self._closing.is_set():
                    return
                self._workers[run_id] = worker
                self._recovering.pop(run_id, None)
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
                self._cancel(run_id)  # its session closed (or its lease ran out) meanwhile

    def _refuse_while_recovering(self, run_id: str) -> None:
        if run_id in self._recovering:
            raise self._rebuilding(run_id)

    @staticmethod
    def _rebuilding(run_id: str) -> Unavailable:
        return Unavailable(
            f"run {run_id} is being rebuilt after a server restart; retry shortly",
            details={"run_id": run_id},
            retry_after=RECOVERY_RETRY_AFTER_S,
        )

    def _worker_or_rebuilding(self, run_id: str) -> tuple[RunWorker | None, bool]:
        """The run's worker, and whether it is being rebuilt (read together)."""
        with self._workers_lock:
            return self._workers.get(run_id), run_id in self._recovering

    # ------------------------------------------------------------------ auth

    def authenticate(self, authorization: str | None) -> str:
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

    # ------------------------------------------------------------------ capabilities

    def capabilities(self) -> dict[str, Any]:
        engine = self._engine()
        max_rank = int(getattr(engine, "MAX_LORA_RANK", DEFAULT_MAX_LORA_RANK))
        base_models = [*engine.BASE_MODELS, *hf_models.served_repo_ids(self.config.hf_cache)]
        return providers.capabilities(
            base_models, max_rank, self.config.limits, self.config.session_ttl_s
        )

    def _engine(self) -> Any:
        try:
            return _engine_module()
        except ImportError as exc:
            log.error("the training engine cannot be imported: %s", exc)
            raise Unavailable(
                "the training engine is not installed (pip install 'whitney-flows[local]')"
            ) from None

    # ------------------------------------------------------------------ idempotency

    def _idempotent(self, tenant: str, scope: str, key: str | None, body_hash: str) -> str | None:
        if key is None:
            return None
        record = self.journal.get_idempotent(tenant, scope, key)
        if record is None:
            return None
        if record["body_hash"] != body_hash:
            raise IdempotencyConflict(
                f"Idempotency-Key {key!r} was used before with another body",
                details={"idempotency_key": key},
            )
        return record["resource_id"]

    @staticmethod
    def _check_idempotency_key(key: str | None) -> None:
        if key is not None and not 1 <= len(key) <= 255:
            raise InvalidRequest(
                "Idempotency-Key must have 1 to 255 characters",
                details={"field": "Idempotency-Key"},
            )

    def _create_once(
        self,
        tenant: str,
        scope: str,
        model: type[_RequestT],
        body: dict[str, Any],
        idempotency_key: str | None,
        create: Callable[[str, _RequestT], str],
    ) -> str:
        """Validate `body` as `model` and `create(tenant, request)` its resource: the new id,
        or, under an Idempotency-Key used before with the same body, the id that key created."""
        self._check_idempotency_key(idempotency_key)
        try:
            request = model.model_validate(body)
        except ValidationError as exc:
            raise from_validation_error(exc) from None
        body_hash = canonical_hash(request.model_dump(mode="json"))
        with self._idempotency_lock if idempotency_key else nullcontext():
            existing = self._idempotent(tenant, scope, idempotency_key, body_hash)
            if existing is not None:
                return existing
            resource_id = create(tenant, request)
            if idempotency_key:
                self.journal.put_idempotent(tenant, scope, idempotency_key, body_hash, resource_id)
        return resource_id

    # ------------------------------------------------------------------ sessions

    def create_session(
        self, tenant: str, body: dict[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]:
        session_id = self._create_once(
            tenant, "sessions", wire.SessionCreate, body, idempotency_key, self._insert_session
        )
        return self.get_session(tenant, session_id)

    def _insert_session(self, tenant: str, request: wire.SessionCreate) -> str:
        check_labels(request.labels, self.config.limits)
        session_id = _new_id("sess")
        self.journal.insert_session(session_id, tenant, request.labels, self._lease_expiry())
        return session_id

    def _lease_expiry(self) -> float | None:
        """When a lease renewed now ends (a Unix time); None when leases never expire."""
        ttl = self.config.session_ttl_s
        return time.time() + ttl if ttl > 0 else None

    def heartbeat(self, tenant: str, session_id: str) -> dict[str, Any]:
        """Renew an open session's lease; 409 run_not_active for a closed one."""
        session = self._own_session(tenant, session_id)
        if not self.journal.renew_lease(session_id, self._lease_expiry()):
            raise RunNotActive(
                f"session {session_id} is closed ({session['closed_reason']}): its lease "
                "cannot be renewed",
                details={"session_id": session_id, "closed_reason": session["closed_reason"]},
            )
        return self.get_session(tenant, session_id)

    def _reap_expired_leases(self) -> None:
        """Close each session whose lease ran out (its runs cancelled), until shutdown."""
        ttl = self.config.session_ttl_s
        reason = f"lease expired: no heartbeat for {ttl:g} s"
        while not self._closing.wait(min(ttl / 4, REAP_EVERY_S)):
            for session_id in self.journal.expired_sessions(time.time()):
                log.warning(
                    "session %s: %s; closing it and cancelling its runs", session_id, reason
                )
                self._close_session(session_id, reason)

    def _own_session(self, tenant: str, session_id: str) -> dict[str, Any]:
        session = self.journal.get_session(session_id)
        if session is None or session["tenant"] != tenant:
            raise not_found("session", session_id)
        return session

    def get_session(self, tenant: str, session_id: str) -> dict[str, Any]:
        session = self._own_session(tenant, session_id)
        return self._session_out(session, self.journal.session_run_ids(session_id))

    @staticmethod
    def _session_out(session: dict[str, Any], run_ids: list[str] | None) -> dict[str, Any]:
        out = {key: value for key, value in session.items() if key != "tenant"}
        if run_ids is not None:
            out["run_ids"] = run_ids
        return out

    def list_sessions(self, tenant: str, label_filters: list[str]) -> dict[str, Any]:
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
                self._session_out(s, self.journal.session_run_ids(s["session_id"]))
                for s in sessions
            ]
        }

    def close_session(self, tenant: str, session_id: str) -> dict[str, Any]:
        self._own_session(tenant, session_id)
        self._close_session(session_id, "closed by the client")
        return self.get_session(tenant, session_id)

    def _close_session(self, session_id: str, reason: str) -> None:
        """Cancel the session's runs that are not terminal, then close it for `reason`."""
        for run_id in self.journal.session_run_ids(session_id):
            run = self.journal.get_run(run_id)
            if run is not None and run["status"] not in RUN_TERMINAL:
                self._cancel(run_id)
        self.journal.close_session(session_id, reason)

    # ------------------------------------------------------------------ runs

    def create_run(
        self, tenant: str, body: dict[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]:
        run_id = self._create_once(
            tenant, "runs", wire.RunCreate, body, idempotency_key, self._create_run
        )
        return self.get_run(tenant, run_id)

    def _create_run(self, tenant: str, request: wire.RunCreate) -> str:
        session = self._own_session(tenant, request.session_id)
        if session["status"] != "open":
            raise RunNotActive(
                f"session {request.session_id} is closed: it accepts no new run",
                details={"session_id": request.session_id},
            )
        check_labels(request.labels, self.config.limits)
        providers.check_run_role(request.provider, request.role)
        engine = self._engine()
        if request.base_model.startswith(HF_PREFIX):
            self._check_hf_source(request.base_model)
        elif not self._serves(engine, request.base_model):
            raise UnsupportedBaseModel(
                f"base_model: {request.base_model!r} is not served (served: "
                f"{', '.join(engine.BASE_MODELS)}, the Hugging Face repo ids (owner/name) of the "
                "server's cache that GET /v1/training/capabilities lists, or hf:<repo id>)",
                details={"field": "base_model"},
            )
        max_rank = int(getattr(engine, "MAX_LORA_RANK", DEFAULT_MAX_LORA_RANK))
        if request.lora_rank > max_rank:
            raise InvalidRequest(
                f"lora_rank: {request.lora_rank} exceeds max_lora_rank {max_rank}",
                details={"field": "lora_rank", "max_lora_rank": max_rank},
            )
        checkpoint_dir = None
        if request.from_checkpoint is not None:
            checkpoint_dir = self.resolve_checkpoint(
                tenant, request.from_checkpoint, field="from_checkpoint"
            )
        seed = 0 if request.seed is None else request.seed
        if not -(2**63) <= seed < 2**63:
            raise InvalidRequest("seed: must fit in 64 bits", details={"field": "seed"})
        run_id = _new_id("run")
        run = {
            "run_id": run_id,
            "tenant": tenant,
            "session_id": request.session_id,
            "provider": request.provider,
            "base_model": request.base_model,
            "lora_rank": request.lora_rank,
            "seed": seed,
            "role": request.role,
            "trainable": request.trainable,
            "from_checkpoint": request.from_checkpoint,
            "labels": request.labels,
            "status": "allocating",
        }
        self.journal.insert_run(run)
        try:
            engine_run = engine.EngineRun.create(
                base_model=request.base_model,
                lora_rank=request.lora_rank,
                seed=seed,
                role=request.role,
                trainable=request.trainable,
                checkpoint_dir=checkpoint_dir,
                hf_cache=self.config.hf_cache,
            )
        except WhitneyError:
            self.journal.delete_run(run_id)
            raise
        except Exception:
            log.exception("allocating run %s failed", run_id)
            self.journal.delete_run(run_id)
            raise InternalError("allocating the run failed") from None
        self.journal.set_run_step(run_id, int(engine_run.step))
        self.journal.set_run_status(run_id, "ready")
        run["status"] = "ready"
        worker = self._new_worker(run, engine_run)
        with self._workers_lock:
            if self._closing.is_set():
                error = Unavailable("the server is shutting down")
                self.journal.set_run_status(run_id, "failed", error=error_object(error))
                raise error
            self._workers[run_id] = worker
        worker.start()
        if self.journal.get_session(request.session_id)["status"] != "open":
            self._cancel(run_id)  # the session closed while the run was allocated
        return run_id

    def _new_worker(self, run: dict[str, Any], engine_run: Any, frontier: int = 1) -> RunWorker:
        return RunWorker(
            run=run,
            engine=engine_run,
            journal=self.journal,
            hooks=self,
            gap_timeout_s=self.config.gap_timeout_s,
            batch_samples=bool(getattr(self._engine(), "SAMPLE_BATCH_INVARIANT", False)),
            on_exit=self._worker_exited,
            frontier=frontier,
        )

    def _serves(self, engine: Any, base_model: str) -> bool:
        """Whether a plain name is served: a built-in model, or a repo id whose checkpoint in
        the server's Hugging Face cache the engine serves. Only that repo's own directory of
        the cache is read, and only for a name shaped like a repo id; every other name gets the
        same answer before the disk is looked at."""
        if base_model in engine.BASE_MODELS:
            return True
        if not hf_cache.is_repo_id(base_model):
            return False
        directory = hf_cache.snapshot(base_model, self.config.hf_cache)
        if directory is None or not hf_models.has_weights(directory):
            return False
        return hf_models.unsupported_reason(hf_models.read_config(directory)) is None

    def _check_hf_source(self, base_model: str) -> None:
        """An `hf:` base model is a repo id (the engine loads it from the local Hugging Face
        cache only) or a directory under `hf_dirs`; any other name gets this one answer,
        before the disk is looked at, so that no tenant can probe the server's files."""
        source = base_model.removeprefix(HF_PREFIX)
        if hf_cache.is_repo_id(source):
            return
        path = Path(source)
        allowed = any(path.is_relative_to(directory) for directory in self.config.hf_dirs)
        if path.is_absolute() and ".." not in path.parts and allowed:
            return
        raise UnsupportedBaseModel(
            f"base_model: {base_model!r} is not served: hf: takes a Hugging Face repo id "
            "(owner/name) from the server's local cache, or a directory the server allows "
            "(serve --hf-dir)",
            details={"field": "base_model"},
        )

    def _worker_exited(self, run_id: str) -> None:
        with self._workers_lock:
            self._workers.pop(run_id, None)

    def _worker(self, run_id: str) -> RunWorker | None:
        with self._workers_lock:
            return self._workers.get(run_id)

    def _own_run(self, tenant: str, run_id: str, live: bool = False) -> dict[str, Any]:
        """The caller's run (404 for another tenant's); `live`: an active run's fixed fields
        from memory, without a journal read (not its status, step or next_seq_id)."""
        if live:
            worker = self._worker(run_id)
            if worker is not None:
                if worker.tenant != tenant:
                    raise not_found("run", run_id)
                return worker.run
        run = self.journal.get_run(run_id)
        if run is None or run["tenant"] != tenant:
            raise not_found("run", run_id)
        return run

    @staticmethod
    def _run_out(run: dict[str, Any]) -> dict[str, Any]:
        return {
            "run_id": run["run_id"],
            "session_id": run["session_id"],
            "provider": run["provider"],
            "base_model": run["base_model"],
            "lora_rank": run["lora_rank"],
            "role": run["role"],
            "trainable": run["trainable"],
            "status": run["status"],
            "next_seq_id": run["next_seq_id"],
            "step": run["step"],
            "error": run["error"],
            "created_at": run["created_at"],
            "finished_at": run["finished_at"],
            "seed": run["seed"],
            "from_checkpoint": run["from_checkpoint"],
            "labels": run["labels"],
        }

    def get_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        return self._run_out(self._own_run(tenant, run_id))

    def finish_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        self._own_run(tenant, run_id, live=True)
        self._refuse_while_recovering(run_id)
        worker = self._worker(run_id)
        if worker is not None:
            worker.finish()
            worker.wait_exit(self.config.post_wait_s)
        return self.get_run(tenant, run_id)

    def cancel_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        self._own_run(tenant, run_id, live=True)
        self._refuse_while_recovering(run_id)
        self._cancel(run_id)
        return self.get_run(tenant, run_id)

    def _cancel(self, run_id: str) -> None:
        worker = self._worker(run_id)
        if worker is not None:
            worker.cancel()
            worker.wait_exit(self.config.post_wait_s)

    # ------------------------------------------------------------------ checkpoints, files

    def state_dir(self, run_id: str, name: str) -> Path:
        return self.data_dir / "runs" / run_id / "states" / name

    def sampler_path(self, run_id: str, sampler_id: str) -> Path:
        return self.data_dir / "runs" / run_id / "samplers" / f"{sampler_id}.safetensors"

    def checkpoint_uri(self, run_id: str, name: str) -> str:
        return checkpoint_uri(run_id, name)

    def new_artifact_path(self) -> tuple[str, Path]:
        artifact_id = _new_id("art")
        return artifact_id, self.data_dir / "artifacts" / f"{artifact_id}.tar"

    def _parse_checkpoint(self, tenant: str, uri: str, field: str) -> tuple[str, str]:
        parts = split_checkpoint(uri)
        if parts is None or not _valid_name(parts[1]):
            raise InvalidRequest(
                f"{field}: expected whitney://runs/<run_id>/states/<name>, got {uri!r}",
                details={"field": field},
            )
        owner = self.journal.get_run(parts[0])
        if owner is None or owner["tenant"] != tenant:
            raise NotFound(f"{field}: checkpoint {uri!r} not found", details={"field": field})
        return parts

    def resolve_checkpoint(self, tenant: str, uri: str, field: str = "checkpoint") -> Path:
        """The directory of a `whitney://runs/{run_id}/states/{name}` checkpoint of `tenant`."""
        run_id, name = self._parse_checkpoint(tenant, uri, field)
        record = self.journal.get_checkpoint(run_id, name)
        if record is None or not Path(record["path"]).is_dir():
            raise NotFound(f"{field}: checkpoint {uri!r} not found", details={"field": field})
        return Path(record["path"])

    def artifact_path(self, tenant: str, artifact_id: str) -> tuple[Path, dict[str, Any]]:
        artifact = self.journal.get_artifact(artifact_id)
        if artifact is None or artifact["tenant"] != tenant or not Path(artifact["path"]).exists():
            raise not_found("artifact", artifact_id)
        return Path(artifact["path"]), artifact

    # ------------------------------------------------------------------ operations

    def submit_operation(
        self, tenant: str, run_id: str, sampler_id: str | None, body: Any
    ) -> RawJson | Waiting:
        """Journal an operation (or find its stored twin) and answer once it is terminal or
        after `post_wait_s` (a `Waiting` while it is not)."""
        run = self._own_run(tenant, run_id, live=True)
        if not isinstance(body, dict):
            raise InvalidRequest("body: expected a JSON object", details={"field": "body"})
        try:
            request = wire.OperationRequest.model_validate(body)
        except ValidationError as exc:
            raise from_validation_error(exc) from None
        if sampler_id is not None and not _valid_name(sampler_id):
            raise InvalidRequest(
                f"sampler_id: invalid sampler id {sampler_id!r}", details={"field": "sampler_id"}
            )
        kind, seq_id = request.kind, request.seq_id
        providers.check_route(kind, sampler_id is not None, run_id)
        try:
            model = wire.validate_payload(kind, request.payload)
        except ValidationError as exc:
            raise from_validation_error(exc, "payload") from None
        payload = model.model_dump(mode="json")
        payload_json = canonical_json(payload)
        payload_hash = hashlib.sha256(payload_json.encode()).hexdigest()

        worker, rebuilding = self._worker_or_rebuilding(run_id)
        if worker is None:
            # not active: only a resend of a journaled operation gets an answer, and while the
            # run is rebuilt only that of a terminal one
            header = self.journal.get_operation_header(run_id, seq_id)
            if rebuilding and (header is None or header["status"] not in OP_TERMINAL):
                raise self._rebuilding(run_id)
            self._existing(run_id, seq_id, kind, sampler_id, payload_hash)
            return self._render(run_id, seq_id)
        with worker.cond:
            header = self._existing(run_id, seq_id, kind, sampler_id, payload_hash)
            if header is not None:
                ticket = worker.tickets.get(seq_id)
            else:
                if worker.status != "ready":
                    raise RunNotActive(
                        f"run {run_id} is {worker.status}: it accepts no new operation",
                        details={"run_id": run_id, "status": worker.status},
                    )
                self._check_new_operation(tenant, run, worker, seq_id, kind, sampler_id, payload)
                submitted_at = self.journal.insert_operation(
                    run_id, seq_id, kind, sampler_id, payload_hash, payload_json
                )
                ticket = Ticket(
                    seq_id=seq_id,
                    kind=kind,
                    sampler_id=sampler_id,
                    payload=payload,
                    submitted_at=submitted_at,
                )
                worker.add(ticket)
        return self._answer(run_id, seq_id, ticket, self.config.post_wait_s)

    def _answer(
        self, run_id: str, seq_id: int, ticket: Ticket | None, wait_s: float
    ) -> RawJson | Waiting:
        """The operation now, or a `Waiting` while its `ticket` is not done within `wait_s`."""
        if ticket is None or wait_s <= 0 or ticket.done.is_set() or self._closing.is_set():
            return self._render(run_id, seq_id)
        return Waiting(run_id, seq_id, ticket, wait_s)

    async def wait(self, waiting: Waiting) -> None:
        """On the event loop, holding no thread: until the operation is terminal, the server
        stops (`wake_waiters`) or `waiting.timeout_s` has passed."""
        if not self._closing.is_set():
            await wait_event(waiting.ticket.done, waiting.timeout_s)

    def render_waited(self, waiting: Waiting) -> RawJson:
        """The operation, after `wait(waiting)`."""
        return self._render(waiting.run_id, waiting.seq_id)

    def _check_new_operation(
        self,
        tenant: str,
        run: dict[str, Any],
        worker: RunWorker,
        seq_id: int,
        kind: str,
        sampler_id: str | None,
        payload: dict[str, Any],
    ) -> None:
        """Everything a new operation can be refused for without running it, before it is
        journaled (the caller holds `worker.cond`): the limits, the provider's rules, names,
        the sampler, the checkpoint, and the engine's checks of every field."""
        run_id, limits = run["run_id"], self.config.limits
        check_seq_window(seq_id, self.journal.get_run(run_id)["next_seq_id"], limits)
        check_pending(len(worker.tickets), limits)
        check_payload(kind, payload, limits)
        providers.check_operation(run, kind, payload)
        self._check_names(run_id, seq_id, kind, payload)
        if sampler_id is not None:
            self._check_sampler(worker, seq_id, sampler_id)
        if kind == "load_state":
            self._check_checkpoint(tenant, worker, seq_id, payload["checkpoint"])
        engine = worker.engine
        if engine is not None:
            from whitney.local.engine import validation  # torch: loaded with the run's engine

            validation.check_request(kind, payload, engine.role, engine.cfg)

    def _check_sampler(self, worker: RunWorker, seq_id: int, sampler_id: str) -> None:
        """A sampler that exists, or that a save_weights_for_sampler before `seq_id` will
        produce: journaled, or possibly still to come while a seq_id before is missing."""
        run_id, kind = worker.run_id, "save_weights_for_sampler"
        if sampler_id in worker.samplers or not _journaled_before(worker, seq_id):
            return
        if self._made_before(run_id, seq_id, kind, sampler_id):
            return
        raise NotFound(
            f"sampler_id: sampler {sampler_id!r} does not exist on run {worker.run_id} and no "
            f"save_weights_for_sampler before seq_id {seq_id} produces it",
            details={"field": "sampler_id", "sampler_id": sampler_id},
        )

    def _check_checkpoint(self, tenant: str, worker: RunWorker, seq_id: int, uri: str) -> None:
        """A load_state checkpoint that exists, or that a save_state of this run before
        `seq_id` will write: journaled, or possibly still to come while a seq_id before is
        missing."""
        field, run_id = "payload.checkpoint", worker.run_id
        owner, name = self._parse_checkpoint(tenant, uri, field)
        if (
            owner == run_id
            and self.journal.get_checkpoint(run_id, name) is None
            and (
                not _journaled_before(worker, seq_id)
                or self._made_before(run_id, seq_id, "save_state", name)
            )
        ):
            return
        self.resolve_checkpoint(tenant, uri, field=field)

    def _made_before(self, run_id: str, seq_id: int, kind: str, name: str) -> bool:
        """Whether a journaled `kind` operation of the run before `seq_id` is named `name`,
        by its payload or by default (`sampler-<seq>`, `seq-<seq>`)."""
        named = self.journal.names_in_use(run_id, kind)
        if name in named:
            return named[name] < seq_id
        default = default_sampler_id if kind == "save_weights_for_sampler" else default_state_name
        match = re.fullmatch(r"(?:sampler|seq)-(\d+)", name)
        if match is None or default(int(match[1])) != name:
            return False
        made_by = int(match[1])
        header = self.journal.get_operation_header(run_id, made_by)
        unnamed = made_by not in named.values()
        return made_by < seq_id and unnamed and header is not None and header["kind"] == kind

    def _render(self, run_id: str, seq_id: int) -> RawJson:
        row = self.journal.get_operation(run_id, seq_id)
        if row is None:  # pragma: no cover - journaled before we look
            raise InternalError("operation vanished from the journal")
        return RawJson(render_operation(row))

    def _existing(
        self, run_id: str, seq_id: int, kind: str, sampler_id: str | None, payload_hash: str
    ) -> dict[str, Any] | None:
        header = self.journal.get_operation_header(run_id, seq_id)
        if header is None:
            worker = self._worker(run_id)
            if worker is None:
                run = self.journal.get_run(run_id)
                status = run["status"] if run else "unknown"
                raise RunNotActive(
                    f"run {run_id} is {status}: it accepts no new operation",
                    details={"run_id": run_id, "status": status},
                )
            return None
        if (header["kind"], header["sampler_id"], header["payload_hash"]) != (
            kind,
            sampler_id,
            payload_hash,
        ):
            differs = (
                "kind"
                if header["kind"] != kind
                else "sampler_id"
                if header["sampler_id"] != sampler_id
                else "payload"
            )
            raise SeqConflict(
                f"seq_id: operation {seq_id} of run {run_id} was journaled with another "
                f"{differs} (stored kind {header['kind']!r})",
                details={"seq_id": seq_id, "stored_kind": header["kind"], "differs": differs},
            )
        return header

    def _check_names(self, run_id: str, seq_id: int, kind: str, payload: dict[str, Any]) -> None:
        if kind not in ("save_weights_for_sampler", "save_state"):
            return
        name = payload.get("name")
        if name is None:
            return
        if name in (".", ".."):
            raise InvalidRequest(f"payload.name: invalid name {name!r}")
        used = self.journal.names_in_use(run_id, kind)
        default = default_sampler_id if kind == "save_weights_for_sampler" else default_state_name
        match = re.fullmatch(r"(?:sampler|seq)-(\d+)", name)
        taken_by_default = (
            match is not None
            and default(int(match[1])) == name
            and self.journal.get_operation_header(run_id, int(match[1])) is not None
        )
        if (name in used and used[name] != seq_id) or taken_by_default:
            what = "sampler" if kind == "save_weights_for_sampler" else "checkpoint"
            raise SeqConflict(
                f"payload.name: {what} name {name!r} was used before in run {run_id}",
                details={"name": name, "seq_id": seq_id},
            )

    def get_operation(
        self, tenant: str, run_id: str, seq_id: int, wait_s: float
    ) -> RawJson | Waiting:
        self._own_run(tenant, run_id, live=True)
        row = self.journal.get_operation(run_id, seq_id)
        if row is None:
            raise NotFound(
                f"operation {seq_id} of run {run_id} not found",
                details={"run_id": run_id, "seq_id": seq_id},
            )
        if row["status"] not in OP_TERMINAL and wait_s > 0:
            worker, rebuilding = self._worker_or_rebuilding(run_id)
            if rebuilding:
                raise self._rebuilding(run_id)
            ticket = worker.ticket(seq_id) if worker is not None else None
            return self._answer(run_id, seq_id, ticket, min(wait_s, MAX_WAIT_S))
        return RawJson(render_operation(row))

    def list_operations(
        self, tenant: str, run_id: str, after_seq: int, limit: int | None
    ) -> RawJson:
        self._own_run(tenant, run_id)
        limit = DEFAULT_LIST_LIMIT if limit is None else limit
        if limit < 1 or limit > MAX_LIST_LIMIT:
            raise InvalidRequest(
                f"limit: must be within 1..{MAX_LIST_LIMIT}, got {limit}",
                details={"field": "limit"},
            )
        rows = self.journal.list_operations(run_id, after_seq, limit)
        return RawJson('{"operations":[' + ",".join(render_operation(r) for r in rows) + "]}")
