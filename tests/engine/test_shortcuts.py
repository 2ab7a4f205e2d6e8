"""Work the engine reuses or skips changes no bit it returns: the trainer's merged weights,
reused until the adapter changes, give the numbers a fresh build gives (the sampler's, built
from a snapshot of the same adapter), and stale ones are never used after an optim_step or a
load_state."""

from __future__ import annotations

from whitney.local.engine import EngineRun

from .helpers import datum, make_sequences, train_a_little


def forward_logprobs(run: EngineRun, sequences: list[list[int]]) -> list[list[float]]:
    data = [datum(s[:-1], s[1:]) for s in sequences]
    result = run.forward({"data": data, "loss_function": "cross_entropy"}, backward=False).result
    return [out["logprobs"] for out in result["outputs"]]


def sampler_logprobs(run: EngineRun, sampler: str, sequences: list[list[int]]) -> list[list]:
    body = {"sequences": [{"token_ids": s} for s in sequences]}
    return [row[1:] for row in run.logprobs(sampler, body).result["logprobs"]]


def test_reused_trainer_weights_are_those_of_the_current_adapter(tmp_path) -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    sequences = make_sequences(7, 5)
    train_a_little(run, steps=1)
    run.save_state(tmp_path / "one")
    first = forward_logprobs(run, sequences)
    assert forward_logprobs(run, sequences) == first  # reused
    run.save_weights_for_sampler("one")
    assert sampler_logprobs(run, "one", sequences) == first  # a fresh build's bits
    train_a_little(run, steps=1)  # built at the old version during its forward_backward
    second = forward_logprobs(run, sequences)
    assert second != first
    run.save_weights_for_sampler("two")
    assert sampler_logprobs(run, "two", sequences) == second
    run.load_state(tmp_path / "one")
    assert forward_logprobs(run, sequences) == first
