"""The metrics of cookbook RL datums, which send no `weights` (the cookbook drops its `mask`):
`tokens:sum` and `kl_sample_train:mean` count only the sampled positions, against a hand
computation here, while the loss stays Tinker's (every position weighted 1)."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

from tests.local.served import ServedWhitney
from tests.tinker.steps import PROMPT, SAMPLE, sdk_key

OFFSETS = (0.25, -0.125, 0.5, 0.0625)
"""What the sampler logprobs the datums send are moved by, per sampled token: off-policy by a
known amount (on-policy the sampler's logprobs are the learner's, bit for bit)."""
ADVANTAGES = (1.0, -0.5)


def _datum(
    tokens: list[int], logprobs: list[float], advantage: float, **extra: list
) -> types.Datum:
    """A cookbook RL datum: the prompt's positions padded with 0 logprobs and advantages."""
    full = PROMPT + tokens
    pad = [0.0] * (len(PROMPT) - 1)
    inputs = {
        "target_tokens": full[1:],
        "logprobs": pad + logprobs,
        "advantages": pad + [advantage] * len(tokens),
        **extra,
    }
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs)


def test_rl_metrics_without_weights_count_the_sampled_tokens(server: ServedWhitney) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=sdk_key(0))
    training = service.create_lora_training_client(base_model="local/tiny", rank=4, seed=2).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(PROMPT)
    sequences = sampler.sample(prompt, 2, types.SamplingParams(**SAMPLE)).result().sequences
    rows = []
    for sequence, advantage in zip(sequences, ADVANTAGES, strict=True):
        tokens = list(sequence.tokens)
        moved = [float(np.float32(q + d)) for q, d in zip(sequence.logprobs, OFFSETS, strict=False)]
        rows.append((tokens, moved, advantage))
    data = [_datum(*row) for row in rows]
    output = training.forward(data, "importance_sampling").result()

    q_minus_lp, terms = [], []
    for (tokens, moved, advantage), out in zip(rows, output.loss_fn_outputs, strict=True):
        lp = np.asarray(out["logprobs"].data, np.float64)[len(PROMPT) - 1 :]
        assert len(lp) == len(tokens)
        q_minus_lp += [q - p for q, p in zip(moved, lp, strict=True)]
        terms += [-np.exp(p - q) * advantage for q, p in zip(moved, lp, strict=True)]
    sampled = sum(len(tokens) for tokens, _, _ in rows)
    assert output.metrics["tokens:sum"] == sampled
    assert output.metrics["kl_sample_train:mean"] == pytest.approx(np.mean(q_minus_lp), abs=1e-5)
    offsets = [d for tokens, _, _ in rows for d in OFFSETS[: len(tokens)]]
    assert np.mean(q_minus_lp) == pytest.approx(np.mean(offsets), abs=1e-5)  # lp_t is q_t
    assert output.metrics["loss:sum"] == pytest.approx(sum(terms), rel=1e-5)

    ones = [_datum(*row, weights=[1.0] * (len(PROMPT) + len(row[0]) - 1)) for row in rows]
    tinker_weights = training.forward(ones, "importance_sampling").result()
    assert tinker_weights.metrics["loss:sum"] == output.metrics["loss:sum"]  # the same loss
    assert tinker_weights.metrics["tokens:sum"] > sampled  # every position counted
    assert tinker_weights.metrics["kl_sample_train:mean"] > output.metrics["kl_sample_train:mean"]
