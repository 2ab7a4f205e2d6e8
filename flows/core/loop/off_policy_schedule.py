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

from dataclasses import dataclass

from pydantic import BaseModel, Field

from flows.core.config import checkpoint_due


class SampleBlock(BaseModel):
    """A later cycle's sample requests, submitted by the cycle that published their sampler
    (one per prompt, on consecutive seq ids), which the later cycle reads back."""

    cycle: int = Field(description="The cycle that trains on these samples")
    sampler_id: str
    seq_start: int = Field(description="Seq id of its first request")


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
