"""Hypothesis properties: every datum the helpers build aligns with its input tokens."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from whitney import wire
from whitney.advantages import group_mean_advantages, leave_one_out_baseline
from whitney.datums import rl_datum, sft_datum
from whitney.payloads import forward_backward_payload

tokens = st.integers(min_value=0, max_value=200_000)
prompts = st.lists(tokens, min_size=1, max_size=24)
completions = st.lists(tokens, min_size=0, max_size=24)
logprob = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)
real = st.floats(min_value=-100.0, max_value=100.0, allow_nan=False)

settings.register_profile("sdk", max_examples=150, deadline=None)


def assert_aligned(datum, prompt, completion):
    token_ids = datum["input"]["token_ids"]
    full = prompt + completion
    assert token_ids == full[:-1]
    for name, tensor in datum["loss_inputs"].items():
        assert tensor["shape"] == [len(token_ids)], name
        assert len(tensor["values"]) == len(token_ids), name
    assert datum["loss_inputs"]["target_tokens"]["values"] == full[1:]
    assert datum["loss_inputs"]["weights"]["values"] == (
        [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    )
    wire.Datum.model_validate(datum)


@settings(settings.get_profile("sdk"))
@given(prompt=prompts, completion=completions)
def test_sft_datum_aligns(prompt, completion):
    assume(len(prompt) + len(completion) >= 2)
    assert_aligned(sft_datum(prompt, completion), prompt, completion)


@st.composite
def rl_cases(draw):
    prompt = draw(prompts)
    completion = draw(st.lists(tokens, min_size=1, max_size=24))
    logprobs = draw(st.lists(logprob, min_size=len(completion), max_size=len(completion)))
    advantage = draw(
        st.one_of(real, st.lists(real, min_size=len(completion), max_size=len(completion)))
    )
    clip_low = draw(st.none() | st.floats(min_value=0.0, max_value=1.0))
    clip_high = draw(st.none() | st.floats(min_value=1.0, max_value=10.0))
    return prompt, completion, logprobs, advantage, clip_low, clip_high


@settings(settings.get_profile("sdk"))
@given(case=rl_cases())
def test_rl_datum_aligns(case):
    prompt, completion, logprobs, advantage, clip_low, clip_high = case
    datum = rl_datum(
        prompt, completion, logprobs, advantage, clip_low=clip_low, clip_high=clip_high
    )
    assert_aligned(datum, prompt, completion)
    pad = [0.0] * (len(prompt) - 1)
    inputs = datum["loss_inputs"]
    assert inputs["logprobs"]["values"] == pad + logprobs
    expected = [float(advantage)] * len(completion) if isinstance(advantage, float) else advantage
    assert inputs["advantages"]["values"] == pad + expected
    assert ("clip_low_threshold" in inputs) == (clip_low is not None)
    assert ("clip_high_threshold" in inputs) == (clip_high is not None)
    wire.ForwardPayload.model_validate(forward_backward_payload([datum], "importance_sampling"))


@settings(settings.get_profile("sdk"))
@given(rewards=st.lists(real, min_size=2, max_size=16))
def test_group_advantages_are_centred_and_loo_is_their_rescaling(rewards):
    centred = group_mean_advantages(rewards)
    assert sum(centred) == pytest.approx(0.0, abs=1e-9 * len(rewards) * 100)
    n = len(rewards)
    # r_i - (S - r_i)/(n-1) = n/(n-1) * (r_i - S/n)
    expected = [n / (n - 1) * value for value in centred]
    assert leave_one_out_baseline(rewards) == pytest.approx(expected, abs=1e-9)
