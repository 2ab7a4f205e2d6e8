"""The ordered executor: one worker per run, with two lanes that keep seq_id order where it
matters.

An operation is journaled `pending` before it gets here. The training lane runs the run
operations (forward_backward, optim_step, save_weights_for_sampler, save_state, ...) strictly
in seq_id order: one runs once every seq_id before it is journaled and every run operation
before it is terminal. The sampler lane runs the sampler operations (sample, logprobs) beside
it: a sampler operation reads an immutable snapshot and a seed of its own, so nothing the
training lane does can change its result, and it runs as soon as its sampler is published (or,
if its sampler is never published, once everything before it is settled: it then fails
`not_found`, as in seq order). A run's results are therefore those of one call after another in
seq order, whatever overlaps. An operation ahead of a missing seq_id that it must wait for
fails with `seq_gap` once it has waited `gap_timeout_s` (the POST that submitted it had already
been answered: the failure is the operation's terminal status, with `error.type ==
"seq_gap"`). `sample` operations ready on one sampler run as batched engine calls when the
engine declares batching bitwise batch-invariant, each call at most `MAX_SAMPLE_BATCH`
operations and `batch_tokens` tokens (num_samples x (prompt + max_tokens) each; a larger one
runs alone), so the memory one call takes is bounded and the results are those of any split.

Cancelling the run (or closing its session) sets the engine's `interrupt`: the engine checks it
at every decode step, forward chunk and layer (backward too) and raises `OperationCancelled`,
so the running operation ends `cancelled` within a layer's or a token step's time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from whitney.errors import (
    InternalError,
    NonFiniteResult,
    SeqGap,
)
from whitney.local.api_errors import error_object
from whitney.local.execution import Engine, Execution, Outcome, RunHooks, Ticket
from whitney.local.journal import Journal
from whitney.local.limits import sample_tokens
from whitney.local.tinker_provider import TinkerRun

log = logging.getLogger("whitney.local.executor")

MAX_SAMPLE_BATCH = 64
SAMPLER_KINDS = frozenset({"sample", "logprobs"})
"""The operations of the sampler lane."""


class RunWorker:
    """Owns one run's engine and executes its journaled operations in seq_id order."""

    def __init__(
        self,
        *,
        run: dict[str, Any],
        engine: Engine,
        journal: Journal,
        hooks: RunHooks,
        gap_timeout_s: float,
        batch_samples: bool,
        batch_tokens: int,
        on_exit: Callable[[str], None] | None = None,
        frontier: int = 1,
    ) -> None:
        self.run = dict(run)
        self.run_id: str = run["run_id"]
        self.tenant: str = run["tenant"]
        self.run_seed: int = run["seed"]
        self.role: str = run["role"]
        self.status: str = run["status"]
        self.engine: Engine | None = engine
        self.interrupt = threading.Event()
        engine.interrupt = self.interrupt
        self.journal = journal
        self.hooks = hooks
        self._execution = Execution(
            self.run_id, self.tenant, self.run_seed, run["base_model"], journal, hooks
        )
        self.gap_timeout_s = gap_timeout_s
        self.batch_samples = batch_samples
        self.batch_tokens = batch_tokens
        self.on_exit = on_exit
        self.cond = threading.Condition()
        self.tickets: dict[int, Ticket] = {}
        self.terminal_ahead: set[int] = set()  # terminal seq_ids beyond the frontier
        self.frontier = frontier
        self.samplers: set[str] = set()
        self._gap_since: float | None = None
        self._stopping = False
        self._lanes_done = False  # the training lane is leaving: the sampler lane leaves too
        self._thread = threading.Thread(
            target=self._loop, name=f"whitney-run-{self.run_id}", daemon=True
        )
        self._sampler_lane = threading.Thread(
            target=self._sampler_loop, name=f"whitney-run-{self.run_id}-sampler", daemon=True
        )

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        self._thread.start()

    def add(self, ticket: Ticket) -> None:
        """Queue an operation just journaled (the caller holds `cond`)."""
        self.tickets[ticket.seq_id] = ticket
        self.cond.notify_all()

    def resume(self, tickets: list[Ticket], terminal_ahead: set[int], samplers: set[str]) -> None:
        """Before `start`, a rebuilt run's queue: its operations not yet run, the terminal
        seq_ids past its frontier, and its samplers (see `whitney.local.recovery`)."""
        self.tickets = {ticket.seq_id: ticket for ticket in tickets}
        self.terminal_ahead = set(terminal_ahead)
        self.samplers = set(samplers)

    def ticket(self, seq_id: int) -> Ticket | None:
        with self.cond:
            return self.tickets.get(seq_id)

    def finish(self) -> None:
        """ready -> finishing: the queue drains, then the run is `finished`."""
        with self.cond:
            if self.status in ("ready", "allocating"):
                self._set_status("finishing")
                self.cond.notify_all()

    def cancel(self) -> None:
        """-> cancelling: pending operations end `cancelled`; the running one is interrupted
        (it ends `cancelled` at the engine's next check, unless it completes first)."""
        with self.cond:
            if self.status not in ("ready", "allocating", "finishing"):
                return
            self._set_status("cancelling")
            for ticket in sorted(self.tickets.values(), key=lambda t: t.seq_id):
                if not ticket.running:
                    self._conclude(
                        ticket,
                        Outcome(
                            "cancelled",
                            error={
                                "type": "cancelled",
                                "message": f"run {self.run_id} was cancelled before "
                                f"operation {ticket.seq_id} ran",
                                "details": {},
                            },
                        ),
                    )
            self.interrupt.set()
            self.cond.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        """Server shutdown: finish the running operation, leave the rest pending, exit."""
        with self.cond:
            self._stopping = True
            for ticket in self.tickets.values():
                ticket.done.set()  # wake waiters; they read the journal
            self.cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait_exit(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ state

    def _set_status(self, status: str, error: dict[str, Any] | None = None) -> None:
        self.status = status
        self.journal.set_run_status(self.run_id, status, error=error)

    def _conclude(self, ticket: Ticket, outcome: Outcome) -> None:
        """Journal a terminal operation and wake its waiters (the caller holds `cond`). A result
        that JSON cannot carry (a non-finite number) is journaled as its failure instead."""
        try:
            finished_at = self._journal_final(ticket, outcome)
        except NonFiniteResult as exc:
            outcome = Outcome("failed", error=error_object(exc))
            finished_at = self._journal_final(ticket, outcome)
        ticket.final = {
            "status": outcome.status,
            "result": outcome.result,
            "error": outcome.error,
            "usage": outcome.usage,
            "finished_at": finished_at,
        }
        if ticket.kind == "save_weights_for_sampler" and outcome.status == "succeeded":
            self.samplers.add(outcome.result["sampler_id"])
        self.tickets.pop(ticket.seq_id, None)
        if ticket.seq_id >= self.frontier:
            self.terminal_ahead.add(ticket.seq_id)
        while self.frontier in self.terminal_ahead:
            self.terminal_ahead.discard(self.frontier)
            self.frontier += 1
        ticket.done.set()

    def _journal_final(self, ticket: Ticket, outcome: Outcome) -> str:
        return self.journal.finish_operation(
            self.run_id,
            ticket.seq_id,
            outcome.status,
            result=outcome.result,
            error=outcome.error,
            usage=outcome.usage,
        )

    def _fail_gap(self, ticket: Ticket, immediate: bool = False) -> None:
        missing = self.frontier
        reason = (
            "the run is finishing, so it can never be filled"
            if immediate
            else f"it stayed open for {self.gap_timeout_s:g} s (gap_timeout_s)"
        )
        gap = SeqGap(
            f"operation {ticket.seq_id} waited for seq_id {missing}, which never arrived: {reason}",
            details={"seq_id": ticket.seq_id, "missing_seq_id": missing},
        )
        self._conclude(ticket, Outcome("failed", error=error_object(gap)))

    # ------------------------------------------------------------------ the lanes

    def _waits_before(self, seq_id: int) -> bool:
        """Whether a seq_id before `seq_id` is missing or holds a run operation that is not
        terminal (the caller holds `cond`)."""
        for seq in range(self.frontier, seq_id):
            ticket = self.tickets.get(seq)
            if ticket is None and seq not in self.terminal_ahead:
                return True  # a gap
            if ticket is not None and ticket.kind not in SAMPLER_KINDS:
                return True
        return False

    def _ready(self, ticket: Ticket) -> bool:
        """A run operation: nothing before it waits; a sampler operation: its sampler is
        published, or nothing before it waits (it then runs, and fails if the sampler is
        missing)."""
        if ticket.kind in SAMPLER_KINDS and ticket.sampler_id in self.samplers:
            return True
        return not self._waits_before(ticket.seq_id)

    def _queued(self, sampler_lane: bool) -> list[Ticket]:
        """The lane's tickets not running, in seq_id order."""
        return sorted(
            (
                ticket
                for ticket in self.tickets.values()
                if not ticket.running and (ticket.kind in SAMPLER_KINDS) == sampler_lane
            ),
            key=lambda ticket: ticket.seq_id,
        )

    def _next_training(self) -> Ticket | None:
        """Wait for the next run operation to run (with cond held); None when the worker
        must leave. Fails with seq_gap what waits on a gap for too long (or at all, finishing)."""
        while True:
            if self._stopping or self.status == "cancelling":
                return None
            queued = self._queued(sampler_lane=False)
            if queued and self._ready(queued[0]):
                self._gap_since = None
                return queued[0]
            if not self.tickets:
                self._gap_since = None
                if self.status == "finishing":
                    return None
                self.cond.wait()
                continue
            blocked = [ticket for ticket in self._queued_all() if not self._ready(ticket)]
            if not blocked:  # only the sampler lane has work
                self.cond.wait()
                continue
            if self.status == "finishing":
                for ticket in blocked:
                    self._fail_gap(ticket, immediate=True)
                continue
            now = time.monotonic()
            if self._gap_since is None:
                self._gap_since = now
            next_deadline = None
            for ticket in blocked:
                deadline = max(self._gap_since, ticket.submitted) + self.gap_timeout_s
                if deadline <= now:
                    self._fail_gap(ticket)
                elif next_deadline is None or deadline < next_deadline:
                    next_deadline = deadline
            if next_deadline is not None:
                self.cond.wait(max(0.0, next_deadline - now))

    def _queued_all(self) -> list[Ticket]:
        return sorted(
            (ticket for ticket in self.tickets.values() if not ticket.running),
            key=lambda ticket: ticket.seq_id,
        )

    def _next_samples(self) -> list[Ticket] | None:
        """Wait for the next sampler operations to run (with cond held): the first ready one,
        with the `sample`s ready on its sampler when batching; None when the worker leaves."""
        while True:
            if self._stopping or self._lanes_done or self.status == "cancelling":
                return None
            ready = [ticket for ticket in self._queued(sampler_lane=True) if self._ready(ticket)]
            if ready:
                return self._batch_from(ready)
            self.cond.wait()

    def _batch_from(self, ready: list[Ticket]) -> list[Ticket]:
        """The first ready operation, with the `sample`s ready on its sampler that fit in one
        engine call (`MAX_SAMPLE_BATCH` operations, `batch_tokens` tokens) when batching."""
        head = ready[0]
        batch = [head]
        if head.kind != "sample" or not self.batch_samples:
            return batch
        tokens = sample_tokens(head.payload)
        for ticket in ready[1:]:
            if len(batch) == MAX_SAMPLE_BATCH:
                break
            if ticket.kind != "sample" or ticket.sampler_id != head.sampler_id:
                continue
            tokens += sample_tokens(ticket.payload)
            if tokens > self.batch_tokens:
                break
            batch.append(ticket)
        return batch

    def _run_batch(self, batch: list[Ticket]) -> None:
        """Execute `batch` (marked running by the caller) and conclude it."""
        self.journal.mark_running(self.run_id, [ticket.seq_id for ticket in batch])
        assert self.engine is not None
        outcomes = self._execution.run(self.engine, batch, self.samplers)
        with self.cond:
            for ticket, outcome in zip(batch, outcomes, strict=True):
                ticket.running = False
                self._conclude(ticket, outcome)
            self.cond.notify_all()

    def _sampler_loop(self) -> None:
        """The sampler lane: sampler operations, beside the training lane."""
        try:
            while True:
                with self.cond:
                    batch = self._next_samples()
                    if batch is None:
                        return
                    for ticket in batch:
                        ticket.running = True
                self._run_batch(batch)
        except Exception:  # pragma: no cover - a bug in the worker itself
            log.exception("run worker %s: the sampler lane crashed", self.run_id)
            with self.cond:
                self._crashed = True
                self.cond.notify_all()

    def _loop(self) -> None:
        """The training lane, which starts the sampler lane and ends the run."""
        self._crashed = False
        self._sampler_lane.start()
        try:
            while True:
                with self.cond:
                    if self._crashed:
                        raise RuntimeError("the sampler lane crashed")
                    ticket = self._next_training()
                    if ticket is None:
                        break
                    ticket.running = True
                if isinstance(self.engine, TinkerRun):  # its record is by seq_id
                    self.engine.seq_id = ticket.seq_id
                self._run_batch([ticket])
            self._leave_lanes()
            with self.cond:
                if not self._stopping:
                    final = "cancelled" if self.status == "cancelling" else "finished"
                    self._set_status(final)
                    self._release(final)
        except Exception:  # pragma: no cover - a bug in the worker itself
            log.exception("run worker %s crashed", self.run_id)
            self._leave_lanes()
            with self.cond:
                error = error_object(InternalError("the run's worker failed"))
                for ticket in list(self.tickets.values()):
                    self._conclude(ticket, Outcome("failed", error=error))
                self._set_status("failed", error=error)
                self._release("failed")
        finally:
            if self.on_exit is not None and not self._stopping:
                self.on_exit(self.run_id)

    def _release(self, status: str) -> None:
        """The run ended `status`: release the weights (a forwarded run's provider model too,
        `TinkerRun.close`)."""
        close = getattr(self.engine, "close", None)
        self.engine = None
        if close is not None:
            close(status)

    def _leave_lanes(self) -> None:
        """Tell the sampler lane to leave once its running batch is done, and wait for it."""
        with self.cond:
            self._lanes_done = True
            self.cond.notify_all()
        self._sampler_lane.join()
