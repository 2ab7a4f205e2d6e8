"""`Runs`: creating a run (its base model, its engine, its worker), reading, finishing and
cancelling it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whitney import hf_cache, wire
from whitney.errors import (
    InternalError,
    InvalidRequest,
    RunNotActive,
    Unavailable,
    UnsupportedBaseModel,
    WhitneyError,
)
from whitney.local import hf_models, providers, tinker_endpoint, tinker_provider
from whitney.local.api_errors import error_object, not_found
from whitney.local.config import ServerConfig
from whitney.local.executor import RunWorker
from whitney.local.files import RunFiles
from whitney.local.idempotency import Idempotency
from whitney.local.journal import Journal, run_out
from whitney.local.limits import check_labels
from whitney.local.names import new_id
from whitney.local.sessions import Sessions
from whitney.local.workers import Workers

log = logging.getLogger("whitney.local")

DEFAULT_MAX_LORA_RANK = 64
HF_PREFIX = "hf:"  # `hf:<repo id>` base models go to the engine, which loads them offline


def engine_module() -> Any:
    """The training engine (torch: imported on first use, preloaded at start)."""
    from whitney.local import engine

    return engine


def load_engine() -> Any:
    """The training engine, or 503 `unavailable` when it is not installed."""
    try:
        return engine_module()
    except ImportError as exc:
        log.error("the training engine cannot be imported: %s", exc)
        raise Unavailable(
            "the training engine is not installed (pip install 'whitney-flows[local]')"
        ) from None


def max_lora_rank(engine: Any) -> int:
    return int(getattr(engine, "MAX_LORA_RANK", DEFAULT_MAX_LORA_RANK))


@dataclass(eq=False, repr=False)
class Runs:
    """Each tenant's runs; an active run's worker is in `workers`."""

    config: ServerConfig
    journal: Journal
    workers: Workers
    files: RunFiles
    sessions: Sessions
    idempotency: Idempotency

    def create(
        self, tenant: str, body: dict[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]:
        run_id = self.idempotency.create_once(
            tenant, "runs", wire.RunCreate, body, idempotency_key, self._create
        )
        return self.get(tenant, run_id)

    def _create(self, tenant: str, request: wire.RunCreate) -> str:
        session = self.sessions.own(tenant, request.session_id)
        if session["status"] != "open":
            raise RunNotActive(
                f"session {request.session_id} is closed: it accepts no new run",
                details={"session_id": request.session_id},
            )
        check_labels(request.labels, self.config.limits)
        providers.check_run_role(request.provider, request.role)
        forwarded = request.provider == "tinker" and self.config.tinker_url is not None
        if not forwarded:  # a forwarded run's model and rank are the endpoint's to refuse
            self._check_served(request)
        checkpoint_dir = None
        if request.from_checkpoint is not None:
            checkpoint_dir = self.files.resolve_checkpoint(
                tenant, request.from_checkpoint, field="from_checkpoint"
            )
            tinker_provider.check_loadable(
                checkpoint_dir,
                forwarded=forwarded,
                uri=request.from_checkpoint,
                field="from_checkpoint",
            )
        seed = 0 if request.seed is None else request.seed
        if not -(2**63) <= seed < 2**63:
            raise InvalidRequest("seed: must fit in 64 bits", details={"field": "seed"})
        run_id = new_id("run")
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
        if forwarded:
            run["trained_at"] = tinker_endpoint.endpoint_of(str(self.config.tinker_url))
        self.journal.insert_run(run)
        try:
            engine_run = self._allocate(run, checkpoint_dir)
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
        worker = self.new_worker(run, engine_run)
        if not self.workers.add(run_id, worker):
            error = Unavailable("the server is shutting down")
            self.journal.set_run_status(run_id, "failed", error=error_object(error))
            raise error
        worker.start()
        if self.journal.get_session(request.session_id)["status"] != "open":
            self.workers.cancel(run_id)  # the session closed while the run was allocated
        return run_id

    def _check_served(self, request: wire.RunCreate) -> None:
        """The CPU engine serves the base model and the rank."""
        engine = load_engine()
        if request.base_model.startswith(HF_PREFIX):
            self._check_hf_source(request.base_model)
        elif not self._serves(engine, request.base_model):
            raise UnsupportedBaseModel(
                f"base_model: {request.base_model!r} is not served (served: "
                f"{', '.join(engine.BASE_MODELS)}, the Hugging Face repo ids (owner/name) of the "
                "server's cache that GET /v1/training/capabilities lists, or hf:<repo id>)",
                details={"field": "base_model"},
            )
        max_rank = max_lora_rank(engine)
        if request.lora_rank > max_rank:
            raise InvalidRequest(
                f"lora_rank: {request.lora_rank} exceeds max_lora_rank {max_rank}",
                details={"field": "lora_rank", "max_lora_rank": max_rank},
            )

    def _allocate(self, run: dict[str, Any], checkpoint_dir: Path | None) -> Any:
        """The run's engine: a Tinker model when the run is forwarded (`trained_at`), else
        the CPU engine's."""
        if run.get("trained_at"):
            return tinker_provider.TinkerRun.create(
                str(self.config.tinker_url),
                base_model=run["base_model"],
                lora_rank=run["lora_rank"],
                seed=run["seed"],
                checkpoint_dir=checkpoint_dir,
                record=self.files.tinker_record(run["run_id"]),
            )
        return load_engine().EngineRun.create(
            base_model=run["base_model"],
            lora_rank=run["lora_rank"],
            seed=run["seed"],
            role=run["role"],
            trainable=run["trainable"],
            checkpoint_dir=checkpoint_dir,
            hf_cache=self.config.hf_cache,
        )

    def new_worker(self, run: dict[str, Any], engine_run: Any, frontier: int = 1) -> RunWorker:
        """The (not yet started) worker of `run` on its engine, executing from `frontier`."""
        return RunWorker(
            run=run,
            engine=engine_run,
            journal=self.journal,
            hooks=self.files,
            gap_timeout_s=self.config.gap_timeout_s,
            batch_samples=bool(getattr(load_engine(), "SAMPLE_BATCH_INVARIANT", False)),
            batch_tokens=self.config.limits.max_tokens_per_sample_batch,
            on_exit=self.workers.exited,
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

    def own(self, tenant: str, run_id: str, live: bool = False) -> dict[str, Any]:
        """The caller's run (404 for another tenant's); `live`: an active run's fixed fields
        from memory, without a journal read (not its status, step or next_seq_id)."""
        if live:
            worker = self.workers.get(run_id)
            if worker is not None:
                if worker.tenant != tenant:
                    raise not_found("run", run_id)
                return worker.run
        run = self.journal.get_run(run_id)
        if run is None or run["tenant"] != tenant:
            raise not_found("run", run_id)
        return run

    def get(self, tenant: str, run_id: str) -> dict[str, Any]:
        return run_out(self.own(tenant, run_id))

    def finish(self, tenant: str, run_id: str) -> dict[str, Any]:
        self.own(tenant, run_id, live=True)
        self.workers.refuse_while_recovering(run_id)
        self.workers.finish(run_id)
        return self.get(tenant, run_id)

    def cancel(self, tenant: str, run_id: str) -> dict[str, Any]:
        self.own(tenant, run_id, live=True)
        self.workers.refuse_while_recovering(run_id)
        self.workers.cancel(run_id)
        return self.get(tenant, run_id)
