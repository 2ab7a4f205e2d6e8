"""Sampling: logprobs of the truncated distribution, stop tokens, seeds, batching, isolation."""

from __future__ import annotations

import math

import pytest
import torch

from whitney.errors import WhitneyError
from whitney.local.engine import EngineRun
from whitney.local.engine.model import CONFIGS, Llama, init_weights
from whitney.local.engine.sampling import SampleSpec, SamplingParams, draw, sample
from whitney.tokenizers import EOS_ID

from .helpers import hf_peft, train_a_little, trained_run

PROMPTS = ([256, 72, 105, 33], [256, 10, 20, 30, 40, 50, 60, 70, 80], [5])


@pytest.fixture(scope="module")
def run() -> EngineRun:
    return trained_run(seed=21, steps=3, lr=1e-2, sampler="s0")


def request(prompt, n=4, **params) -> dict:
    return {
        "prompt": {"token_ids": list(prompt)},
        "num_samples": n,
        "sampling_params": {"max_tokens": 12} | params,
    }


def kept_distribution(logits: torch.Tensor, temperature: float, top_k, top_p) -> dict[int, float]:
    """The distribution sampled from, written out: scale, keep the top_k, renormalise, keep the
    shortest prefix (by descending probability) reaching top_p, renormalise."""
    probs = torch.softmax(logits.double() / temperature, -1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    if top_k is not None:
        order = order[:top_k]
    total = sum(probs[i] for i in order)
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.append(i)
        mass += probs[i] / total
    z = sum(probs[i] for i in kept)
    return {i: probs[i] / z for i in kept}


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, None, 1.0), (0.7, 20, 1.0), (1.3, None, 0.8), (1.0, 40, 0.6)],
)
def test_logprobs_are_those_of_the_truncated_distribution(run, temperature, top_k, top_p):
    reference = hf_peft(run)  # unmerged LoRA, computed by transformers + peft
    prompt = PROMPTS[0]
    out = run.sample(
        "s0", [request(prompt, temperature=temperature, top_k=top_k, top_p=top_p, seed=5)], [0]
    )[0]
    for seq in out.result["sequences"]:
        ids = prompt + seq["tokens"]
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([ids])).logits[0]
        for k, (tok, lp) in enumerate(zip(seq["tokens"], seq["logprobs"], strict=True)):
            dist = kept_distribution(logits[len(prompt) - 1 + k], temperature, top_k, top_p)
            assert tok in dist, f"token {tok} at {k} is outside the truncated support"
            assert lp == pytest.approx(math.log(dist[tok]), abs=1e-4)
            if top_k is not None or top_p < 1:
                assert len(dist) < 260


def test_draw_is_the_inverse_cdf_and_never_a_token_of_probability_zero() -> None:
    """Each row's token, against the inverse CDF written out: the first token whose running sum
    (left to right, in float64) passes u times the row's total; at u = 1 (the total itself) the
    last token of nonzero probability, never the zero-probability tail."""
    generator = torch.Generator().manual_seed(4)
    logprobs = torch.randn(6, 50, generator=generator, dtype=torch.float64).log_softmax(-1)
    logprobs[:, 40:] = float("-inf")
    logprobs[5, 17:] = float("-inf")
    u = torch.rand(6, generator=generator)
    u[4:] = 1.0
    expected = []
    for row, uniform in zip(logprobs.exp().tolist(), u.tolist(), strict=True):
        running, sums = 0.0, []
        for p in row:
            running += p
            sums.append(running)
        first = next((i for i, s in enumerate(sums) if s > uniform * running), len(row))
        expected.append(min(first, max(i for i, p in enumerate(row) if p > 0)))
    assert draw(logprobs, u).tolist() == expected
    assert expected[4:] == [39, 16]


def test_uniform_model_draws_uniformly_and_stops_at_eos() -> None:
    cfg = CONFIGS["local/nano"]
    weights = init_weights(cfg) | {"lm_head.weight": torch.zeros(260, cfg.hidden_size)}
    model = Llama(cfg, weights)
    with torch.inference_mode():
        (seqs,) = sample(model, [SampleSpec([1, 2, 3], 64, SamplingParams(max_tokens=200), 1)])
    tokens = [t for s in seqs for t in s["tokens"]]
    assert all(lp == pytest.approx(-math.log(260), abs=1e-5) for s in seqs for lp in s["logprobs"])
    assert len(set(tokens)) > 250  # ~ 7000 uniform draws cover the vocabulary
    counts = torch.bincount(torch.tensor(tokens), minlength=260).float()
    chi2 = ((counts - counts.mean()) ** 2 / counts.mean()).sum().item()
    assert chi2 < 400  # 259 degrees of freedom: mean 259, sd ~23
    stopped = [s for s in seqs if s["stop_reason"] == "stop"]
    assert 10 < len(stopped) < 60  # P(EOS within 200) = 1 - (259/260)^200 ~ 0.54
    for s in seqs:
        assert EOS_ID not in s["tokens"][:-1]
        if s["stop_reason"] == "stop":
            assert s["tokens"][-1] == EOS_ID
        else:
            assert len(s["tokens"]) == 200


def test_stop_token_ids_end_sequences(run) -> None:
    stops = list(range(0, 100))
    out = run.sample("s0", [request(PROMPTS[1], n=16, stop_token_ids=stops, seed=3)], [0])[0]
    reasons = {s["stop_reason"] for s in out.result["sequences"]}
    assert "stop" in reasons
    for s in out.result["sequences"]:
        assert not set(s["tokens"][:-1]) & set(stops + [EOS_ID])
        assert len(s["logprobs"]) == len(s["tokens"])
        if s["stop_reason"] == "stop":
            assert s["tokens"][-1] in stops + [EOS_ID]
        else:
            assert len(s["tokens"]) == 12
    sampled = sum(len(s["tokens"]) for s in out.result["sequences"])
    assert out.result["prompt_tokens"] == len(PROMPTS[1])
    assert out.usage == {
        "tokens": len(PROMPTS[1]) + sampled,
        "prefill_tokens": len(PROMPTS[1]),
        "sampled_tokens": sampled,
    }


def test_seeds_are_reproducible_and_default_seeds_apply(run) -> None:
    a = run.sample("s0", [request(PROMPTS[0], seed=7)], [0])[0].result
    b = run.sample("s0", [request(PROMPTS[0], seed=7)], [99])[0].result
    c = run.sample("s0", [request(PROMPTS[0], seed=8)], [0])[0].result
    assert a == b and a != c
    rows = [s["tokens"] for s in a["sequences"]]
    assert len({tuple(r) for r in rows}) == len(rows)  # each row has its own generator
    d = run.sample("s0", [request(PROMPTS[0])], [7])[0].result  # seed None -> default seed 7
    e = run.sample("s0", [request(PROMPTS[0])], [8])[0].result
    assert d == a and e == c


def test_batched_requests_are_bitwise_identical_to_each_alone(run) -> None:
    requests = [
        request(PROMPTS[0], n=3, seed=1),
        request(PROMPTS[1], n=5, temperature=0.8, top_p=0.9),
        request(PROMPTS[2], n=2, top_k=10, stop_token_ids=[65, 66], seed=4),
        request(PROMPTS[0], n=1, temperature=0),
    ]
    defaults = [11, 12, 13, 14]
    together = run.sample("s0", requests, defaults)
    for req, seed, out in zip(requests, defaults, together, strict=True):
        alone = run.sample("s0", [req], [seed])[0]
        assert alone == out  # tokens, logprobs (floats compared exactly), stop reasons, usage
    greedy = together[3].result["sequences"][0]
    assert greedy["logprobs"] == [0.0] * len(greedy["tokens"])


def test_logprobs_match_transformers_and_peft(run) -> None:
    reference = hf_peft(run)
    sequences = [list(p) + [65, 66, 67] for p in PROMPTS]
    out = run.logprobs("s0", {"sequences": [{"token_ids": s} for s in sequences]})
    assert out.usage == {"tokens": sum(len(s) for s in sequences)}
    for s, got in zip(sequences, out.result["logprobs"], strict=True):
        with torch.no_grad():
            logp = torch.log_softmax(reference(input_ids=torch.tensor([s])).logits[0], -1)
        want = [logp[i - 1, s[i]].item() for i in range(1, len(s))]
        assert got[0] is None
        assert got[1:] == pytest.approx(want, abs=1e-5)


def test_sampler_snapshot_is_isolated_from_training() -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=2)
    train_a_little(run, steps=1)
    run.save_weights_for_sampler("before")
    body = {"sequences": [{"token_ids": [256, 1, 2, 3, 4, 5]}]}
    lp0 = run.logprobs("before", body).result
    s0 = run.sample("before", [request(PROMPTS[0], seed=1)], [0])[0].result
    for sampler in ("x", "y", "z"):  # new weights each time: evicts the merged copy of "before"
        train_a_little(run, steps=1, lr=1e-2)
        run.save_weights_for_sampler(sampler)
        run.logprobs(sampler, body)
    assert len({run.samplers[s] for s in ("before", "x", "y", "z")}) == 4
    assert run.samplers["before"] not in run.sampler_models
    assert run.logprobs("before", body).result == lp0
    assert run.sample("before", [request(PROMPTS[0], seed=1)], [0])[0].result == s0
    assert run.logprobs("z", body).result != lp0


def test_sampler_errors(run) -> None:
    with pytest.raises(WhitneyError) as err:
        run.sample("missing", [request(PROMPTS[0])], [0])
    assert err.value.type == "not_found"
    with pytest.raises(WhitneyError) as err:
        run.logprobs("missing", {"sequences": []})
    assert err.value.type == "not_found"
    bad = [
        request([]),
        request([300]),
        request([1], n=0),
        request([1], max_tokens=0),
        request([1], max_tokens=5000),
        request([1], top_p=0.0),
        request([1], top_k=0),
        request([1], temperature=-1.0),
    ]
    for req in bad:
        with pytest.raises(WhitneyError) as err:
            run.sample("s0", [req], [0])
        assert err.value.type == "invalid_request"
    with pytest.raises(WhitneyError):
        run.save_weights_for_sampler("s0")
