"""`logprobs` of a sequence are bitwise the same whatever else the call holds: a client may cut
a batch into chunks any way it likes (the distillation flow's teacher fan-out relies on it).

Attention kernels block their work by sequence length, so a sequence padded to a longer batch
mate gets different last bits; the engine therefore runs sequences of one length together,
unpadded. The checks use a trained adapter and lengths on both sides of the kernels' blocks.
"""

from __future__ import annotations

import random

import pytest
import torch

from whitney.local.engine import EngineRun

from .helpers import train_a_little

LENGTHS = (1, 2, 3, 15, 16, 17, 31, 32, 33, 40, 64, 65, 100)


@pytest.fixture(scope="module")
def run() -> EngineRun:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=3)
    train_a_little(run, steps=2)
    run.save_weights_for_sampler("s")
    return run


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
        logp = model.logits(model.hidden(ids)).log_softmax(-1)[0, :-1]
        expected = logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()
    assert row == [None, *expected]
