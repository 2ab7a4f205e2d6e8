"""The official SDK trains, samples and scores through the Tinker routes exactly as
`WhitneyClient` does through Whitney's: the same numbers bit for bit, the same adapter."""

from __future__ import annotations

import numpy as np

from tests.local.served import ServedWhitney
from tests.tinker.steps import (
    KEYS,
    SL,
    adapter_sha256,
    assert_same,
    sdk_key,
    through_tinker,
    through_whitney,
)


def test_the_sdk_and_whitney_client_give_the_same_bits_and_adapter(server: ServedWhitney) -> None:
    tinker_trace = through_tinker(server.url, sdk_key(0))
    whitney_trace = through_whitney(server.url, KEYS[0])
    assert_same(tinker_trace, whitney_trace)
    assert adapter_sha256(server.url, KEYS[0], tinker_trace.run_id) == adapter_sha256(
        server.url, KEYS[0], whitney_trace.run_id
    )
    # the training learned, and Tinker's cross_entropy is sum(-w_t * lp_t) over the datums
    first_loss, first_logprobs = tinker_trace.losses[0], tinker_trace.logprobs[0]
    expected = 0.0
    for (prompt, _), logprobs in zip(SL, first_logprobs, strict=True):
        weights = np.array([0.0] * (len(prompt) - 1) + [1.0] * (len(logprobs) - len(prompt) + 1))
        expected += float(-(weights * np.asarray(logprobs, np.float64)).sum())
    assert abs(first_loss - expected) < 1e-4 * abs(expected)
    assert tinker_trace.losses[-1] < first_loss
    assert len(tinker_trace.samples) == 2
    assert all(1 <= len(tokens) <= 4 for tokens, _ in tinker_trace.samples)
    assert tinker_trace.prompt_logprobs[0] is None
