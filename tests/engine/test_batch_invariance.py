"""A sequence's numbers depend only on the weights and the sequence: its `logprobs`, its
`forward` / `forward_backward` outputs and its loss contribution are bitwise the same whatever
it is batched with, however a request is chunked or ordered, and whatever the padding; and the
logprobs `sample` returns (temperature 1, no truncation) are bitwise those `forward` computes,
so `kl_sample_train` is exactly 0 on-policy. The checks use a trained adapter and lengths on
both sides of common kernel block sizes (16, 32, 64).
"""

from __future__ import annotations

import random

import pytest
import torch

from whitney.local.engine import EngineRun, exact

from .helpers import datum, make_sequences, train_a_little, trained_run

LENGTHS = (1, 2, 3, 15, 16, 17, 31, 32, 33, 40, 64, 65, 100)


@pytest.fixture(scope="module")
def run() -> EngineRun:
    return trained_run(seed=3, steps=2, sampler="s")


def logprobs(run: EngineRun, sequences: list[list[int]]) -> list[list[float | None]]:
    body = {"sequences": [{"token_ids": sequence} for sequence in sequences]}
    return run.logprobs("s", body).result["logprobs"]


def test_any_chunking_and_order_gives_the_same_bits(run: EngineRun) -> None:
    rng = random.Random(0)
    sequences = [[rng.randrange(0, 258) for _ in range(rng.choice(LENGTHS))] for _ in range(60)]
    whole = logprobs(run, sequences)
    assert [len(row) for row in whole] == [len(s) for s in sequences]
    assert all(row[0] is None for row in whole)
    for _ in range(6):
        order = list(range(len(sequences)))
        rng.shuffle(order)
        size = rng.randint(1, 25)
        found: dict[int, list[float | None]] = {}
        for start in range(0, len(order), size):
            part = order[start : start + size]
            for index, row in zip(part, logprobs(run, [sequences[i] for i in part]), strict=True):
                found[index] = row
        assert [found[i] for i in range(len(sequences))] == whole  # exact, not approx
    assert [logprobs(run, [s])[0] for s in sequences] == whole


def test_the_values_are_the_models_own(run: EngineRun) -> None:
    sequence = [256, *b"Q: What sound does the frog make?\nA: The frog says croak.", 257]
    (row,) = logprobs(run, [sequence])
    model = run.sampler_model("s")
    with torch.inference_mode():
        ids = torch.tensor([sequence])
        logp = exact.log_softmax(model.logits(model.hidden(ids)))[0, :-1]
        expected = logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()
    assert row == [None, *expected]


def cross_entropy_datum(sequence: list[int]) -> dict:
    return datum(sequence[:-1], sequence[1:])


def forward(run: EngineRun, data: list[dict], backward: bool, loss: str = "cross_entropy"):
    body = {"data": data, "loss_function": loss, "loss_config": {}}
    return run.forward(body, backward=backward).result


def zero_weight(sequence: list[int]) -> dict:
    """A datum that contributes nothing to the loss (but pads its batch-mates)."""
    return datum(sequence[:-1], sequence[1:], weights=[0.0] * (len(sequence) - 1))


@pytest.mark.parametrize("backward", [False, True])
def test_forward_outputs_and_loss_contributions_do_not_depend_on_batch_mates(
    backward: bool,
) -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5)
    train_a_little(run, steps=2)
    rng = random.Random(1)
    data = [cross_entropy_datum(s) for s in make_sequences(7, 24, lengths=(2, 70))]
    alone = [forward(run, [d], backward) for d in data]
    order = list(range(len(data)))
    rng.shuffle(order)
    batch = forward(run, [data[i] for i in order], backward)
    for row, i in enumerate(order):
        assert batch["outputs"][row] == alone[i]["outputs"][0]  # exact, not approx
    # A datum's contribution is its own: beside zero-weight batch-mates that pad it to 120
    # tokens, or split from the batch, the loss is bitwise the same.
    mates = [zero_weight(s) for s in make_sequences(9, 3, lengths=(100, 120))]
    for i in (0, 5, 11):
        padded = forward(run, [mates[0], data[i], *mates[1:]], backward)
        assert padded["loss"] == alone[i]["loss"]
        assert padded["outputs"][1] == alone[i]["outputs"][0]
    assert forward(run, [data[i] for i in order] + mates, backward)["loss"] == batch["loss"]
    # Summed in datum order in float64 and rounded once: within rounding of the float64 sum of
    # the float32 single-datum losses (each itself a rounding of its float64 contribution).
    running = sum(alone[i]["loss"] for i in order)
    assert batch["loss"] == pytest.approx(running, rel=1e-6)
    if backward:
        run.optim_step({"type": "adamw", "learning_rate": 0.0})  # clears the gradients


def test_critic_values_do_not_depend_on_batch_mates() -> None:
    critic = EngineRun.create(base_model="local/nano", lora_rank=4, seed=6, role="critic")
    sequences = make_sequences(8, 10, lengths=(3, 40))
    data = [
        datum(s, s, values=[0.0] * len(s), returns=[1.0] * len(s), weights=[1.0] * len(s))
        for s in sequences
    ]
    body = {"loss_function": "ppo_critic", "loss_config": {}}
    together = critic.forward(body | {"data": data}, backward=False).result["outputs"]
    for d, out in zip(data, together, strict=True):
        assert critic.forward(body | {"data": [d]}, backward=False).result["outputs"] == [out]


def test_sampled_logprobs_are_the_forward_logprobs_and_kl_is_zero(run: EngineRun) -> None:
    prompts = [[256, *b"Q: frog?"], [256, 7], [256, *b"A longer prompt, to differ in length"]]
    requests = [
        {"prompt": {"token_ids": p}, "num_samples": 3, "sampling_params": {"max_tokens": 24}}
        for p in prompts
    ]
    results = [out.result for out in run.sample("s", requests, [1, 2, 3])]
    data, expected = [], []
    for prompt, result in zip(prompts, results, strict=True):
        for seq in result["sequences"]:
            full, n = prompt + seq["tokens"], len(seq["tokens"])
            pad = len(prompt) - 1
            data.append(
                datum(
                    full[:-1],
                    full[1:],
                    weights=[0.0] * pad + [1.0] * n,
                    logprobs=[0.0] * pad + seq["logprobs"],
                    advantages=[0.0] * pad + [1.0] * n,
                )
            )
            expected.append(seq["logprobs"])
            (row,) = logprobs(run, [full])
            assert row[len(prompt) :] == seq["logprobs"]
    out = run.forward(
        {"data": data, "loss_function": "importance_sampling", "loss_config": {}}, backward=False
    ).result
    for outputs, want, prompt in zip(
        out["outputs"], expected, [p for p in prompts for _ in range(3)], strict=True
    ):
        assert outputs["logprobs"][len(prompt) - 1 :] == want
    assert out["metrics"]["kl_sample_train:mean"] == 0.0
