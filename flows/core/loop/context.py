"""The cycle context: what one cycle of a flow's run works with (its ordered calls, its policy
run, its number, where the flow run started and what earlier cycles handed on), and the calls
every cycle makes around its own middle.

    ctx = CycleContext.open(config, cycle, start, whitney_block, run_id)
    return ctx.finish(run_cycle(plan, ctx), names)

    publish_sampler    save_weights_for_sampler, named `cycle-{n}` or unnamed -> sampler id
    sampler_calls      [the named sampler's publication +] one call per payload on it
    run_tail           forward_backward, optim_step, [save_state cycle-{n}],
                       [save_weights_for_sampler cycle-{n+1}]: together or one by one
    save_checkpoint    save_state cycle-{n}

Submitted together, a block's calls take consecutive seq ids and are awaited at once; one by
one, they take the same ids. The server runs a run's operations strictly in seq order, so the
results, and the adapter, are the same either way (docs/api.md, *Ordering and exactly-once*).
A cycle subflow retried replays: the same calls with the same seq ids, answered from the journal.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from blocks.endpoint import resolve_connection
from flows.core.config import FlowConfig
from flows.core.loop.cycles import CycleResult, CycleStart
from flows.core.loop.off_policy_schedule import SampleBlock
from flows.core.records.run_records import by_run, record_cycle
from tasks.names import cycle_name
from tasks.operations import Call, SequencedClient
from whitney import wire

M = TypeVar("M", bound=CycleResult)


def publish_call(name: str) -> Call:
    """The save_weights_for_sampler that publishes the sampler `name`."""
    return Call("save_weights_for_sampler", {"name": name})


def sampler_calls(
    client: SequencedClient,
    run_id: str,
    sampler_id: str,
    kind: str,
    payloads: Sequence[dict[str, Any]],
    together: bool,
    *,
    publish: bool = False,
) -> list[dict[str, Any]]:
    """One `kind` call per payload on `sampler_id` of `run_id`, after its publication when
    `publish` (the sampler is named, so its calls queue before it answers): one submitted
    block (`together`) or one call after another, on the same seq ids. The calls' results."""
    lead = [publish_call(sampler_id)] if publish else []
    calls = lead + [Call(kind, payload, sampler_id) for payload in payloads]
    operations = client.run_calls(run_id, calls, together)
    if publish:
        operations[0].result_as(wire.SamplerResult)
    return [operation.result or {} for operation in operations[len(lead) :]]


@dataclass(frozen=True)
class CycleTail:
    """What the end of a cycle produced."""

    backward: wire.ForwardResult
    optimized: wire.OptimStepResult
    checkpoint: str | None
    """The `cycle-{n}` checkpoint URI, when one was due."""
    next_sampler_id: str | None
    """The sampler the next cycle samples from, when this cycle published it."""


def tail_calls(
    cycle: int,
    payload: dict[str, Any],
    optimizer: dict[str, Any],
    *,
    checkpoint: bool,
    publish_next: bool,
) -> list[Call]:
    """The cycle's tail in seq order: forward_backward, optim_step, then the `cycle-{n}`
    save_state if `checkpoint`, then the `cycle-{n+1}` sampler if `publish_next`."""
    calls = [Call("forward_backward", payload), Call("optim_step", {"optimizer": optimizer})]
    if checkpoint:
        calls.append(Call("save_state", {"name": cycle_name(cycle)}))
    if publish_next:
        calls.append(publish_call(cycle_name(cycle + 1)))
    return calls


@dataclass(frozen=True)
class CycleClock:
    """When a cycle's own work began (UTC, and the wall clock) and its policy run's first seq
    id: `fields` gives the `CycleResult` fields every flow's metrics share."""

    started_at: datetime
    started: float
    seq_start: int

    def fields(self, ctx: CycleContext) -> dict[str, Any]:
        """cycle, started_at, seq_start, seq_end, op_seconds and wall_seconds, as of now."""
        return {
            "cycle": ctx.cycle,
            "started_at": self.started_at,
            "seq_start": self.seq_start,
            "seq_end": ctx.client.ledger.position(ctx.run_id),
            "op_seconds": dict(ctx.client.log.seconds),
            "wall_seconds": time.perf_counter() - self.started,
        }


@dataclass(frozen=True)
class CycleContext:
    """One cycle of a flow's run: its ordered calls (`client`, every run from its seq id in
    `start`), the policy run `run_id`, the cycle's number, and where it started."""

    client: SequencedClient
    run_id: str
    cycle: int
    start: CycleStart

    @classmethod
    def open(
        cls,
        config: FlowConfig,
        cycle: int,
        start: CycleStart,
        whitney_block: str | None,
        run_id: str,
    ) -> CycleContext:
        """The context of cycle `cycle` of the policy run `run_id`, from `start`."""
        connection = resolve_connection(config.api_url, whitney_block)
        return cls(
            SequencedClient(connection, start.seq_ids, config.task_retry), run_id, cycle, start
        )

    def clock(self) -> CycleClock:
        """The cycle's work begins now, at the policy run's next seq id."""
        position = self.client.ledger.position(self.run_id)
        return CycleClock(datetime.now(UTC), time.perf_counter(), position)

    @property
    def first_cycle(self) -> int:
        """The flow run's first cycle."""
        return self.start.first_cycle

    @property
    def presampled(self) -> list[SampleBlock]:
        """Sample requests earlier cycles made for this one and later ones (off-policy)."""
        return self.start.presampled

    def finish(self, metrics: M, names: Mapping[str, str]) -> M:
        """`metrics` with where every run's next cycle starts (`seq_ends`), after the cycle's
        one artifact: its operations under their run's name in `names` (run id -> name)."""
        ends = {run_id: self.client.ledger.position(run_id) for run_id in self.start.seq_ids}
        metrics = metrics.model_copy(update={"seq_ends": ends})
        record_cycle(metrics, by_run(self.client.log.operations, names), metrics.sections())
        return metrics

    def publish_sampler(self, named: bool) -> str:
        """save_weights_for_sampler at the cycle's start: named `cycle-{n}` or unnamed (the
        Loop building blocks' loop: the server names it); the sampler id."""
        payload = {"name": cycle_name(self.cycle)} if named else {}
        operation = self.client.execute(self.run_id, "save_weights_for_sampler", payload)
        return operation.result_as(wire.SamplerResult).sampler_id

    def run_tail(
        self,
        payload: dict[str, Any],
        optimizer: dict[str, Any],
        *,
        checkpoint: bool = False,
        publish_next: bool = False,
        together: bool = False,
    ) -> CycleTail:
        """The training tail (`tail_calls`) on the policy run: submitted together
        (pipelined: one round trip) or one call after another."""
        calls = tail_calls(
            self.cycle, payload, optimizer, checkpoint=checkpoint, publish_next=publish_next
        )
        operations = self.client.run_calls(self.run_id, calls, together=together)
        by_kind = {operation.kind: operation for operation in operations}
        saved = by_kind.get("save_state")
        published = by_kind.get("save_weights_for_sampler")
        return CycleTail(
            backward=by_kind["forward_backward"].result_as(wire.ForwardResult),
            optimized=by_kind["optim_step"].result_as(wire.OptimStepResult),
            checkpoint=saved.result_as(wire.SaveStateResult).checkpoint if saved else None,
            next_sampler_id=(
                published.result_as(wire.SamplerResult).sampler_id if published else None
            ),
        )

    def save_checkpoint(self) -> str:
        """save_state named `cycle-{n}` on the policy run; its URI."""
        saved = self.client.execute(self.run_id, "save_state", {"name": cycle_name(self.cycle)})
        return saved.result_as(wire.SaveStateResult).checkpoint
