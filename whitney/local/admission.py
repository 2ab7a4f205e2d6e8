"""`Admission`: whether an operation may be journaled. A resend must match what its seq id
holds; a new operation must pass everything it can be refused for without running it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from whitney.errors import InvalidRequest, NotFound, RunNotActive, SeqConflict
from whitney.local import providers, tinker_provider
from whitney.local.config import ServerConfig
from whitney.local.execution import default_sampler_id, default_state_name
from whitney.local.executor import RunWorker
from whitney.local.files import RunFiles
from whitney.local.journal import Journal
from whitney.local.limits import check_payload, check_pending, check_seq_window
from whitney.local.workers import Workers


def _journaled_before(worker: RunWorker, seq_id: int) -> bool:
    """Whether every seq_id of the worker's run before `seq_id` is journaled (the caller
    holds `worker.cond`): below the frontier all are; past it, pending or terminal ones."""
    known = worker.tickets.keys() | worker.terminal_ahead
    return all(seq in known for seq in range(worker.frontier, seq_id))


@dataclass(eq=False, repr=False)
class Admission:
    """The checks of an operation POST against the journal and the run's worker."""

    config: ServerConfig
    journal: Journal
    files: RunFiles
    workers: Workers

    def existing(
        self, run_id: str, seq_id: int, kind: str, sampler_id: str | None, payload_hash: str
    ) -> dict[str, Any] | None:
        """The journaled header of the same operation at `seq_id`; None if none is journaled
        there and the run is active; SeqConflict if another one is, RunNotActive if the run
        is not active."""
        header = self.journal.get_operation_header(run_id, seq_id)
        if header is None:
            worker = self.workers.get(run_id)
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

    def check_new(
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
            forwarded = bool(run.get("trained_at"))
            self._check_checkpoint(tenant, worker, seq_id, payload["checkpoint"], forwarded)
        engine = worker.engine
        if engine is not None and not run.get("trained_at"):  # a forwarded run's: its provider's
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

    def _check_checkpoint(
        self, tenant: str, worker: RunWorker, seq_id: int, uri: str, forwarded: bool
    ) -> None:
        """A load_state checkpoint that exists, or that a save_state of this run before
        `seq_id` will write: journaled, or possibly still to come while a seq_id before is
        missing; not a forwarded run's when this run trains on the CPU engine."""
        field, run_id = "payload.checkpoint", worker.run_id
        owner, name = self.files.parse_checkpoint(tenant, uri, field)
        if (
            owner == run_id
            and self.journal.get_checkpoint(run_id, name) is None
            and (
                not _journaled_before(worker, seq_id)
                or self._made_before(run_id, seq_id, "save_state", name)
            )
        ):
            return
        directory = self.files.resolve_checkpoint(tenant, uri, field=field)
        tinker_provider.check_loadable(directory, forwarded=forwarded, uri=uri, field=field)

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
