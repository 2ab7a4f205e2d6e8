"""The engine learns: SFT with cross_entropy on a fixed short text."""

from __future__ import annotations

from whitney.local.engine import EngineRun
from whitney.tokenizers import ByteTokenizer

from .helpers import datum

TEXT = "The quick brown fox jumps over the lazy dog. "


def test_sft_loss_falls_by_half_within_50_steps() -> None:
    tok = ByteTokenizer()
    ids = [tok.bos_id] + tok.encode(TEXT * 2) + [tok.eos_id]
    payload = {
        "data": [datum(ids[:-1], ids[1:])],
        "loss_function": "cross_entropy",
        "loss_config": {},
    }
    run = EngineRun.create(base_model="local/nano", lora_rank=8, seed=0)
    losses = []
    for _ in range(50):
        losses.append(run.forward(payload, backward=True).result["loss"])
        run.optim_step({"type": "adamw", "learning_rate": 1e-3})
    final = run.forward(payload, backward=False).result["loss"]
    assert final <= 0.5 * losses[0], (losses[0], final)
    assert losses[10] < losses[0] and final < losses[25]
