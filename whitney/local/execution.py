"""What each operation does to a run: its engine call, its files and journal records (a
sampler's snapshot, a checkpoint, an export), and the `Outcome` it ends with (a refusal or a
crash included). The ordered worker (`whitney.local.executor`) decides when; this decides what.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from whitney.errors import (
    InternalError,
    InvalidRequest,
    NotFound,
    OperationCancelled,
    SeqConflict,
    WhitneyError,
)
from whitney.local.api_errors import error_object
from whitney.local.fairness import DoneEvent
from whitney.local.journal import Journal
from whitney.local.stop_strings import stop_watch

log = logging.getLogger("whitney.local.executor")


def default_seed(run_seed: int, seq_id: int) -> int:
    """The seed of an operation that names none: a hash of (run seed, seq_id), 63 bits."""
    digest = hashlib.sha256(f"whitney-local:{run_seed}:{seq_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def default_sampler_id(seq_id: int) -> str:
    return f"sampler-{seq_id}"


def default_state_name(seq_id: int) -> str:
    return f"seq-{seq_id}"


class Engine(Protocol):
    """What the worker needs of `whitney.local.engine.EngineRun`."""

    step: int
    interrupt: threading.Event  # set to stop the running operation (OperationCancelled)

    def forward(self, payload: dict, *, backward: bool) -> Any: ...
    def optim_step(self, optimizer: dict) -> Any: ...
    def save_weights_for_sampler(self, sampler_id: str) -> Any: ...
    def write_sampler(self, sampler_id: str, path: Path) -> None: ...
    def sample(
        self, sampler_id: str, requests: list[dict], default_seeds: list[int], watch: Any = None
    ) -> list[Any]: ...
    def logprobs(self, sampler_id: str, request: dict) -> Any: ...
    def save_state(self, directory: Path) -> Any: ...
    def load_state(self, directory: Path, *, with_optimizer: bool = True) -> Any: ...
    def export_lora(self, archive_path: Path) -> Any: ...


@dataclass
class Ticket:
    """An accepted operation not yet terminal, as the worker holds it."""

    seq_id: int
    kind: str
    sampler_id: str | None
    payload: dict[str, Any]
    submitted_at: str = ""
    submitted: float = field(default_factory=time.monotonic)
    done: DoneEvent = field(default_factory=DoneEvent)  # long-polls subscribe to it
    running: bool = False
    final: dict[str, Any] | None = None  # the terminal operation, once done


@dataclass
class Outcome:
    status: str
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    usage: dict[str, int] = field(default_factory=lambda: {"tokens": 0})


class RunHooks(Protocol):
    """What the worker asks of the service: where files go and what a checkpoint URI means."""

    def state_dir(self, run_id: str, name: str) -> Path: ...
    def sampler_path(self, run_id: str, sampler_id: str) -> Path: ...
    def tinker_record(self, run_id: str) -> Path: ...
    def checkpoint_uri(self, run_id: str, name: str) -> str: ...
    def resolve_checkpoint(self, tenant: str, uri: str) -> Path: ...
    def new_artifact_path(self) -> tuple[str, Path]: ...


@dataclass(eq=False, repr=False)
class Execution:
    """Executes one run's operations on its engine; `run_seed` seeds its samples, the
    tokenizer of `base_model` reads their stop strings."""

    run_id: str
    tenant: str
    run_seed: int
    base_model: str
    journal: Journal
    hooks: RunHooks

    def run(self, engine: Engine, batch: list[Ticket], samplers: set[str]) -> list[Outcome]:
        """Execute `batch` (one operation, or `sample`s batched on one sampler) on `engine`,
        with the run's published `samplers`; each ticket's outcome, a failure included."""
        if len(batch) > 1:
            return self._guard(batch, lambda tickets: self._sample_batch(engine, tickets, samplers))
        return self._guard(batch, lambda tickets: [self._execute_one(engine, tickets[0], samplers)])

    def _guard(
        self, batch: list[Ticket], fn: Callable[[list[Ticket]], list[Outcome]]
    ) -> list[Outcome]:
        try:
            return fn(batch)
        except OperationCancelled:
            return [self._cancelled_while_running(ticket) for ticket in batch]
        except WhitneyError as exc:
            error = error_object(exc)
        except Exception:
            log.exception(
                "run %s: %s at seq_id %d failed", self.run_id, batch[0].kind, batch[0].seq_id
            )
            error = error_object(InternalError(f"internal error while executing {batch[0].kind}"))
        return [Outcome("failed", error=error) for _ in batch]

    def _cancelled_while_running(self, ticket: Ticket) -> Outcome:
        message = f"run {self.run_id} was cancelled while operation {ticket.seq_id} ran"
        return Outcome("cancelled", error={"type": "cancelled", "message": message, "details": {}})

    @staticmethod
    def _ok(output: Any, extra: dict[str, Any] | None = None) -> Outcome:
        result = dict(output.result)
        if extra:
            result.update(extra)
        usage = {key: int(value) for key, value in dict(output.usage).items()}
        usage.setdefault("tokens", 0)
        return Outcome("succeeded", result=result, usage=usage)

    def _require_sampler(self, sampler_id: str | None, samplers: set[str]) -> str:
        if sampler_id is None or sampler_id not in samplers:
            raise NotFound(
                f"sampler {sampler_id!r} does not exist on run {self.run_id} (no earlier "
                "save_weights_for_sampler produced it)",
                details={"sampler_id": sampler_id},
            )
        return sampler_id

    def _sample_batch(
        self, engine: Engine, batch: list[Ticket], samplers: set[str]
    ) -> list[Outcome]:
        sampler_id = self._require_sampler(batch[0].sampler_id, samplers)
        payloads = [ticket.payload for ticket in batch]
        seeds = [default_seed(self.run_seed, ticket.seq_id) for ticket in batch]
        watch = stop_watch(payloads, self.base_model)
        if watch is None:  # a provider's engine need not know watches
            outputs = engine.sample(sampler_id, payloads, seeds)
        else:
            outputs = engine.sample(sampler_id, payloads, seeds, watch)
        return [
            Outcome("failed", error=error_object(output))
            if isinstance(output, WhitneyError)
            else self._ok(output)
            for output in outputs
        ]

    def _execute_one(self, engine: Engine, ticket: Ticket, samplers: set[str]) -> Outcome:
        kind, payload, seq = ticket.kind, ticket.payload, ticket.seq_id
        if kind in ("forward", "forward_backward"):
            return self._ok(engine.forward(payload, backward=kind == "forward_backward"))
        if kind == "optim_step":
            outcome = self._ok(engine.optim_step(payload["optimizer"]))
            self.journal.set_run_step(self.run_id, engine.step)
            return outcome
        if kind == "save_weights_for_sampler":
            sampler_id = payload.get("name") or default_sampler_id(seq)
            if sampler_id in samplers:
                raise SeqConflict(
                    f"payload.name: sampler {sampler_id!r} already exists on run {self.run_id}",
                    details={"sampler_id": sampler_id},
                )
            outcome = self._ok(engine.save_weights_for_sampler(sampler_id))
            engine.write_sampler(sampler_id, self.hooks.sampler_path(self.run_id, sampler_id))
            return outcome  # published to the sampler lane once journaled (`_conclude`)
        if kind == "sample":
            return self._sample_batch(engine, [ticket], samplers)[0]
        if kind == "logprobs":
            return self._ok(
                engine.logprobs(self._require_sampler(ticket.sampler_id, samplers), payload)
            )
        if kind == "save_state":
            name = payload.get("name") or default_state_name(seq)
            if self.journal.get_checkpoint(self.run_id, name) is not None:
                raise SeqConflict(
                    f"payload.name: checkpoint {name!r} already exists on run {self.run_id}",
                    details={"name": name},
                )
            directory = self.hooks.state_dir(self.run_id, name)
            output = engine.save_state(directory)
            uri = self.hooks.checkpoint_uri(self.run_id, name)
            outcome = self._ok(output, {"checkpoint": uri})
            self.journal.insert_checkpoint(
                self.run_id, name, seq, int(output.result.get("step", engine.step)), str(directory)
            )
            return outcome
        if kind == "load_state":
            directory = self.hooks.resolve_checkpoint(self.tenant, payload["checkpoint"])
            outcome = self._ok(
                engine.load_state(directory, with_optimizer=payload.get("with_optimizer", True))
            )
            self.journal.set_run_step(self.run_id, engine.step)
            return outcome
        if kind == "export_lora":
            artifact_id, path = self.hooks.new_artifact_path()
            output = engine.export_lora(path)
            outcome = self._ok(output, {"artifact_id": artifact_id})
            self.journal.insert_artifact(
                {
                    "artifact_id": artifact_id,
                    "tenant": self.tenant,
                    "run_id": self.run_id,
                    "seq_id": seq,
                    "path": str(path),
                    "format": str(output.result.get("format", "peft")),
                    "sha256": str(output.result["sha256"]),
                    "bytes": int(output.result["bytes"]),
                }
            )
            return outcome
        raise InvalidRequest(f"kind: unknown operation kind {kind!r}")
