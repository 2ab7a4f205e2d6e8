"""The ready `sample`s on one sampler run in engine calls of at most
`max_tokens_per_sample_batch` tokens: however they are split, the results are the same bits."""

from __future__ import annotations

from typing import Any

import pytest

from whitney.local import EmbeddedWhitney
from whitney.local.limits import Limits

from .helpers import http, new_run, post_op, sample_request, wait_op

PROMPTS = [[3, 1, 4], [1, 5, 9], [2, 6, 5], [3, 5, 8], [9, 7, 9], [3, 2, 3]]
"""Six samples of 2 x (3 + 5) = 16 tokens each."""


def sampled(limits: Limits) -> tuple[list[dict[str, Any]], int]:
    """The six samples' results on local/tiny queued before their sampler is published (so
    they are ready together), and how many engine calls ran them (distinct `started_at`)."""
    with EmbeddedWhitney(limits=limits, session_ttl_s=0) as server, http(server) as api:
        run_id = new_run(api, base_model="local/tiny", seed=7)["run_id"]
        for seq_id, prompt in enumerate(PROMPTS, start=2):
            payload = sample_request(prompt, 2, 5, temperature=1.0)
            assert post_op(api, run_id, seq_id, "sample", payload, "s").status_code == 200
        assert post_op(api, run_id, 1, "save_weights_for_sampler", {"name": "s"}).status_code == 200
        ops = [wait_op(api, run_id, seq_id) for seq_id in range(2, 2 + len(PROMPTS))]
    assert all(op["status"] == "succeeded" for op in ops), ops
    return [op["result"] for op in ops], len({op["started_at"] for op in ops})


@pytest.fixture(scope="module")
def uncapped() -> tuple[list[dict[str, Any]], int]:
    return sampled(Limits())


@pytest.mark.parametrize(("cap", "calls"), [(1, 6), (40, 3)])
def test_a_capped_split_gives_the_uncapped_bits(uncapped, cap: int, calls: int) -> None:
    results, engine_calls = sampled(Limits(max_tokens_per_sample_batch=cap))
    assert uncapped[1] == 1 and engine_calls == calls
    assert results == uncapped[0]
    tokens = [seq["tokens"] for result in results for seq in result["sequences"]]
    assert len({tuple(t) for t in tokens}) > 1  # the draws really differ
