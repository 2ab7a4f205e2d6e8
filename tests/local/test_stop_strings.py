"""A `sample`'s stop strings end each of its sequences at the token whose text completes one,
as it is drawn: batched beside samples without them (queued before their sampler is
published, so one engine call runs them all), a stopped sequence is the unstopped one cut
there by hand, the others are unchanged, and `sampled_tokens` counts only what was drawn."""

from __future__ import annotations

from typing import Any

from whitney.local import EmbeddedWhitney
from whitney.tokenizers import get_tokenizer

from .helpers import http, new_run, post_op, sample_request, wait_op

PROMPTS = [[3, 1, 4], [1, 5, 9], [2, 6, 5]]
MAX_TOKENS = 10


def _sampled(stops: list[list[str]]) -> list[dict[str, Any]]:
    """The three batched samples (2 sequences each), prompt i with stop strings `stops[i]`."""
    with EmbeddedWhitney(session_ttl_s=0) as server, http(server) as api:
        run_id = new_run(api, base_model="local/tiny", seed=7)["run_id"]
        for seq_id, (prompt, stop) in enumerate(zip(PROMPTS, stops, strict=True), start=2):
            payload = sample_request(prompt, 2, MAX_TOKENS, stop=stop)
            assert post_op(api, run_id, seq_id, "sample", payload, "s").status_code == 200
        assert post_op(api, run_id, 1, "save_weights_for_sampler", {"name": "s"}).status_code == 200
        ops = [wait_op(api, run_id, seq_id) for seq_id in range(2, 2 + len(PROMPTS))]
    assert all(op["status"] == "succeeded" for op in ops), ops
    assert len({op["started_at"] for op in ops}) == 1  # one engine call
    return ops


def test_stop_strings_end_sequences_as_they_are_drawn() -> None:
    free = _sampled([[], [], []])
    decode = get_tokenizer("local/tiny").decode
    i, tokens = next(
        (i, seq["tokens"])
        for i, op in enumerate(free)
        for seq in op["result"]["sequences"]
        if len(seq["tokens"]) >= 6
    )
    stop = decode(tokens[3:5])  # room to stop inside the sequence
    stops: list[list[str]] = [[], [], []]
    stops[i] = [stop, "\x00never"]
    stopped = _sampled(stops)
    others = [k for k in range(len(PROMPTS)) if k != i]
    assert [stopped[k]["result"] for k in others] == [free[k]["result"] for k in others]
    drawn = 0
    for before, after in zip(
        free[i]["result"]["sequences"], stopped[i]["result"]["sequences"], strict=True
    ):
        tokens = before["tokens"]
        end = next((k for k in range(1, len(tokens) + 1) if stop in decode(tokens[:k])), None)
        if end is None:
            assert after == before
        else:
            assert after["tokens"] == tokens[:end] and after["stop_reason"] == "stop"
            assert after["logprobs"] == before["logprobs"][:end]
        drawn += len(after["tokens"])
    assert stopped[i]["usage"]["sampled_tokens"] == drawn < free[i]["usage"]["sampled_tokens"]
