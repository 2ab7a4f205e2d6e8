"""The off-policy schedule (flows.core.loop.off_policy_schedule) and decoupled clipping
(flows.rl.off_policy), by hand: which sampler each cycle uses, which cycle requests whose samples,
and the datums a stale ppo cycle trains on."""

from __future__ import annotations

import math

import pytest

from flows.core.config import ConfigError
from flows.core.loop.off_policy_schedule import Schedule
from flows.rl.config import RLConfig
from flows.rl.off_policy import BEHAVIOUR_WEIGHT_CAP, decouple, decouples, logprobs_requests
from flows.rl.plan import check_rl_config
from whitney.datums import rl_datum


def test_each_stretch_starts_on_policy_and_falls_behind_by_the_staleness() -> None:
    stale = Schedule(staleness=2, first=0, checkpoint_every=5, cycles=12)  # checkpoints 4, 9
    assert [stale.sampler_cycle(n) for n in range(12)] == [0, 0, 0, 1, 2, 5, 5, 5, 6, 7, 10, 10]
    assert [stale.staleness_of(n) for n in range(12)] == [0, 1, 2, 2, 2, 0, 1, 2, 2, 2, 0, 1]
    assert [stale.sampled_at(n) for n in range(12)] == [
        [0, 1, 2],
        [3],
        [4],
        [],
        [],
        [5, 6, 7],
        [8],
        [9],
        [],
        [],
        [10, 11],
        [],
    ]
    requested = sorted(cycle for n in range(12) for cycle in stale.sampled_at(n))
    assert requested == list(range(12))  # every cycle's samples, requested once


def test_on_policy_requests_each_cycles_own_and_a_resumed_run_keeps_the_schedule() -> None:
    on_policy = Schedule(staleness=0, first=0, checkpoint_every=5, cycles=12)
    assert [on_policy.sampled_at(n) for n in range(12)] == [[n] for n in range(12)]
    whole = Schedule(staleness=3, first=0, checkpoint_every=4, cycles=20)
    resumed = Schedule(staleness=3, first=8, checkpoint_every=4, cycles=20)  # from cycle-7
    for cycle in range(8, 20):
        assert resumed.sampler_cycle(cycle) == whole.sampler_cycle(cycle)
        assert resumed.sampled_at(cycle) == whole.sampled_at(cycle)
    never = Schedule(staleness=1, first=0, checkpoint_every=0, cycles=4)
    assert [never.sampler_cycle(n) for n in range(4)] == [0, 0, 1, 2]


def test_sampling_ahead_needs_pipelining_and_concurrent_sampling() -> None:
    for setting in ("pipelined", "concurrent_sampling"):
        with pytest.raises(ConfigError, match=f"max_staleness: .*{setting} = true"):
            check_rl_config(RLConfig(max_staleness=1, **{setting: False}))
    check_rl_config(RLConfig(max_staleness=1))


def test_decoupled_clipping_centres_the_ratio_on_the_current_weights() -> None:
    prompt, tokens = [256, 7, 8], [1, 2, 3]
    behaviour, current = [-1.0, -2.0, -0.5], [-0.7, -2.5, 1.5]
    payload = {
        "data": [rl_datum(prompt, tokens, behaviour, [0.5, -1.0, 2.0])],
        "loss_function": "ppo",
        "loss_config": {},
    }
    (request,) = logprobs_requests(payload)
    assert request == {"sequences": [{"token_ids": prompt + tokens}]}
    scored = [None, -3.0, -1.1, -0.7, -2.5, 1.5]  # logprobs of all 6: the first has none
    decoupled, kl = decouple(payload, [scored])
    inputs = decoupled["data"][0]["loss_inputs"]
    assert inputs["logprobs"]["values"] == [0.0, 0.0, *current]  # the prompt's stay 0
    weights = [
        min(math.exp(c - b), BEHAVIOUR_WEIGHT_CAP) for b, c in zip(behaviour, current, strict=True)
    ]
    assert inputs["advantages"]["values"] == pytest.approx(
        [0.0, 0.0, 0.5 * weights[0], -1.0 * weights[1], 2.0 * BEHAVIOUR_WEIGHT_CAP]
    )
    assert kl == pytest.approx(sum(b - c for b, c in zip(behaviour, current, strict=True)) / 3)
    assert payload["data"][0]["loss_inputs"]["logprobs"]["values"][2:] == behaviour  # untouched
    assert decouples("ppo", 1, True) and decouples("gspo", 2, True)
    assert not decouples("ppo", 0, True) and not decouples("ppo", 1, False)
    assert not any(decouples(loss, 1, True) for loss in ("importance_sampling", "cispo"))
