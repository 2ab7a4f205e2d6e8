"""A cycle's samples under the off-policy schedule (flows.core.loop.off_policy_schedule): requested
now,
with the later cycles' that the schedule starts at this cycle, or read back from the journal when an
earlier cycle requested them. The later cycles' requests stay in flight while the cycle trains (the
server samples beside the training), and the cycle waits for them at its end."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flows.core.loop.off_policy_schedule import SampleBlock, Schedule
from tasks.sequenced_client import Call, SequencedClient, Submitted

Requests = Callable[[int], list[dict[str, Any]]]
"""A cycle's sample requests, one per prompt (deterministic: its seeds come from the cycle)."""


@dataclass(frozen=True)
class CycleSamples:
    """A cycle's own samples, the sampler they came from, and the later cycles' requests it
    submitted (in flight until `wait_ahead`)."""

    sampler_id: str
    samples: list[dict[str, Any]]
    ahead: list[tuple[SampleBlock, Submitted]]

    def wait_ahead(self, client: SequencedClient) -> None:
        """Wait for the later cycles' samples (they ran beside this cycle's training)."""
        for _, block in self.ahead:
            client.collect(block)

    def presampled_after(self, cycle: int, presampled: Sequence[SampleBlock]) -> list[SampleBlock]:
        """The requests made for the cycles after `cycle`: the next cycle's `presampled`."""
        earlier = [block for block in presampled if block.cycle > cycle]
        return earlier + [block for block, _ in self.ahead]


def sample_ahead(
    client: SequencedClient,
    run_id: str,
    cycle: int,
    sampler_id: str,
    schedule: Schedule,
    requests_of: Requests,
    presampled: Sequence[SampleBlock],
    lead: Sequence[Call] = (),
) -> CycleSamples:
    """Submit `lead` (the call publishing `sampler_id`, where the cycle makes it) and the
    sample requests of every cycle the schedule starts at `cycle`, on `sampler_id`, in cycle
    order on the next seq ids; return the cycle's own samples, from that block or, requested
    by an earlier cycle, from the journal (`presampled`)."""
    sampled_now = schedule.sampled_at(cycle)

    def calls(later: int, sampler: str) -> list[Call]:
        return [Call("sample", request, sampler) for request in requests_of(later)]

    head = list(lead) + (calls(cycle, sampler_id) if cycle in sampled_now else [])
    first = client.submit(run_id, head) if head else None
    ahead = []
    for later in sampled_now:
        if later != cycle:
            block = client.submit(run_id, calls(later, sampler_id))
            ahead.append(
                (
                    SampleBlock(cycle=later, sampler_id=sampler_id, seq_start=block.seq_ids.start),
                    block,
                )
            )
    answered = client.collect(first)[len(lead) :] if first is not None else []
    if cycle in sampled_now:
        return CycleSamples(sampler_id, [op.result or {} for op in answered], ahead)
    (earlier,) = [block for block in presampled if block.cycle == cycle]
    operations = client.read_block(run_id, earlier.seq_start, calls(cycle, earlier.sampler_id))
    return CycleSamples(earlier.sampler_id, [op.result or {} for op in operations], ahead)
