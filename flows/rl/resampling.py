"""Dynamic resampling: a group that teaches nothing is sampled again, up to a bound.

A group whose rewards are all equal has all-zero advantages (`all_zero`): its gradient is
zero, and it only dilutes the batch. With `resample_rounds` = k > 0, each round sends one more
`sample` request for every such group (the same prompt and parameters, a fresh seed derived
from (config seed, cycle, group index, round)), through the cycle's client on the policy's
sampler, so the calls take the next seq ids in a fixed order and a replayed cycle makes them
again identically. A group still uniform after k rounds is dropped from the loss. The cycle's
record counts the groups resampled and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from flows.core.seeds import derive_seed
from flows.rl.scoring import GroupScore
from whitney.advantages import all_zero

SampleGroups = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
"""Sample a list of requests in order (submitted together or one by one)."""
ScoreGroup = Callable[[str, dict[str, Any]], GroupScore]
"""The score of a prompt's sample."""


@dataclass(frozen=True)
class Group:
    """A group as it goes to the loss: its latest sample and score, and its history."""

    index: int
    prompt: str
    request: dict[str, Any]
    sample: dict[str, Any]
    score: GroupScore
    resamples: int = 0
    """Extra sample requests made for it."""
    dropped: bool = False
    """Still uniform after every round: left out of the loss."""


def uniform(score: GroupScore) -> bool:
    """No signal: equal rewards (whose centred advantages can be off zero by a rounding
    error), or advantages that are all zero."""
    return score.uniform or all_zero(score.advantages)


def resample_request(request: dict[str, Any], seed: int) -> dict[str, Any]:
    """The same SampleRequest with another sampling seed."""
    return {**request, "sampling_params": {**request["sampling_params"], "seed": seed}}


def resample_uniform_groups(
    groups: Sequence[Group],
    rounds: int,
    sample_groups: SampleGroups,
    score_group: ScoreGroup,
    seed: int,
    cycle: int,
) -> list[Group]:
    """The groups after up to `rounds` rounds of resampling the uniform ones; those still
    uniform after the last round are marked dropped (none are when `rounds` is 0)."""
    current = list(groups)
    for round_number in range(1, rounds + 1):
        pending = [group for group in current if uniform(group.score)]
        if not pending:
            break
        requests = [
            resample_request(group.request, derive_seed(seed, cycle, group.index, round_number))
            for group in pending
        ]
        for group, request, sample in zip(pending, requests, sample_groups(requests), strict=True):
            current[group.index] = replace(
                group,
                request=request,
                sample=sample,
                score=score_group(group.prompt, sample),
                resamples=group.resamples + 1,
            )
    if rounds:
        current = [
            replace(group, dropped=True) if uniform(group.score) else group for group in current
        ]
    return current
