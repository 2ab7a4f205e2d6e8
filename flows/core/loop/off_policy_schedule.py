"""The off-policy schedule: which weights each cycle samples from, and when its sampling starts.

With `max_staleness` s, cycle n samples from the sampler published after optimizer step

    k(n) = max(e(n), n - s)

where e(n) is the first cycle of n's stretch: the flow run's first cycle, or the cycle after the
latest `cycle-{c}` checkpoint before n. A sampler named `cycle-{k}` holds the weights after k
steps, and it is published at the start of cycle k, so cycle n's samples can be requested as
soon as cycle k(n) starts: their sampling runs while cycles k(n) .. n-1 train. Every cycle
trains on exactly its own groups (the schedule is paced, nothing is discarded), and the
schedule is a function of the config alone, so seq ids, sampler names and the adapter are the
same on every run, whatever the timing.

Each stretch starts on-policy, so a checkpoint is a complete resume point: the cycles after it
sample from weights at or after it, which a run created from it has. s = 0 is on-policy: k(n)
= n, and each cycle requests its own samples, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field

from flows.core.config import checkpoint_due
from tasks.operations import Call, SequencedClient, Submitted

if TYPE_CHECKING:
    from flows.core.loop.context import CycleContext


class SampleBlock(BaseModel):
    """A later cycle's sample requests, submitted by the cycle that published their sampler
    (one per prompt, on consecutive seq ids), which the later cycle reads back."""

    cycle: int = Field(description="The cycle that trains on these samples")
    sampler_id: str
    seq_start: int = Field(description="Seq id of its first request")


StalenessField = Annotated[
    int,
    Field(default=0, description="Optimizer steps between that sampler and the trained weights"),
]
"""A sampling cycle's `staleness` metric (RL, distillation), after its `sampler_id`."""
PresampledField = Annotated[
    list[SampleBlock],
    Field(
        default_factory=list,
        description="Later cycles' sample requests already submitted (max_staleness > 0)",
    ),
]
"""A sampling cycle's `presampled` record: what it hands on to later cycles."""
KlSampleTrainField = Annotated[
    float | None,
    Field(description="Mean of sampler minus learner logprob over trained tokens"),
]
"""A sampling cycle's `kl_sample_train` metric."""


@dataclass(frozen=True)
class Schedule:
    """A flow run's off-policy schedule: `staleness` (max_staleness), its `first` cycle, the
    config's `checkpoint_every` and `cycles`."""

    staleness: int
    first: int
    checkpoint_every: int
    cycles: int

    def stretch_start(self, cycle: int) -> int:
        """The first cycle of `cycle`'s stretch: after the latest checkpoint before it, or
        the flow run's first cycle."""
        for earlier in range(cycle - 1, self.first - 1, -1):
            if checkpoint_due(earlier, self.checkpoint_every, self.cycles):
                return earlier + 1
        return self.first

    def sampler_cycle(self, cycle: int) -> int:
        """k(n): the optimizer step whose weights cycle `cycle` samples from (its sampler is
        `cycle-{k}`)."""
        return max(self.stretch_start(cycle), cycle - self.staleness)

    def staleness_of(self, cycle: int) -> int:
        """Optimizer steps between cycle `cycle`'s sampler and the weights it trains."""
        return cycle - self.sampler_cycle(cycle)

    def sampled_at(self, cycle: int) -> list[int]:
        """The cycles whose sampling starts at `cycle` (k(m) == cycle), in order: `cycle`
        itself and up to `staleness` later ones."""
        return [
            later
            for later in range(cycle, min(cycle + self.staleness + 1, self.cycles))
            if self.sampler_cycle(later) == cycle
        ]


# A cycle's samples under the schedule: requested now, with the later cycles' that the
# schedule starts at this cycle, or read back from the journal when an earlier cycle requested
# them. The later cycles' requests stay in flight while the cycle trains (the server samples
# beside the training), and the cycle waits for them at its end.

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
    ctx: CycleContext,
    sampler_id: str,
    schedule: Schedule,
    requests_of: Requests,
    lead: Sequence[Call] = (),
) -> CycleSamples:
    """Submit `lead` (the call publishing `sampler_id`, where the cycle makes it) and the
    sample requests of every cycle the schedule starts at the context's cycle, on `sampler_id`,
    in cycle order on the next seq ids; return the cycle's own samples, from that block or,
    requested by an earlier cycle, from the journal (the context's `presampled`)."""
    client, run_id, cycle, presampled = ctx.client, ctx.run_id, ctx.cycle, ctx.presampled
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
