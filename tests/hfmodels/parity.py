"""The logprob parity measure of a real checkpoint, server against transformers: shared by
tests/hfmodels/test_real_checkpoint.py and benchmarks/real_checkpoint_parity.py (which prints
the differences the test holds to a tolerance)."""

from __future__ import annotations

import torch

CHATS = [
    [
        {"role": "user", "content": "What is 3 + 4?"},
        {"role": "assistant", "content": "3 + 4 = 7"},
    ],
    [
        {"role": "user", "content": "What is 8 + 1?"},
        {"role": "assistant", "content": "8 + 1 = 9"},
    ],
]
"""Two sums as chats, the SFT data of the parity measure."""


def sft_payload(renderer) -> dict:
    """A cross-entropy payload of CHATS as the renderer builds them."""
    data = [renderer.build_supervised(chat).datum() for chat in CHATS]
    return {"data": data, "loss_function": "cross_entropy", "loss_config": {}}


def server_target_logprobs(client, run_id: str, payload: dict) -> list[torch.Tensor]:
    """The logprob of each datum's target tokens under the run's weights (`forward`)."""
    outputs = client.run_operation(run_id, "forward", payload)["outputs"]
    return [torch.tensor(output["logprobs"]) for output in outputs]


def hf_target_logprobs(model: torch.nn.Module, payload: dict) -> list[torch.Tensor]:
    """The same under a transformers model's own float32 forward."""
    rows = []
    for datum in payload["data"]:
        tokens = torch.tensor([datum["input"]["token_ids"]])
        targets = torch.tensor(datum["loss_inputs"]["target_tokens"]["values"])
        with torch.no_grad():
            log_probs = model(tokens).logits[0].float().log_softmax(-1)
        rows.append(log_probs.gather(1, targets[:, None])[:, 0])
    return rows


def max_difference(left: list[torch.Tensor], right: list[torch.Tensor]) -> float:
    """The largest absolute difference of a token's logprob between two sets of rows."""
    return max((a - b).abs().max().item() for a, b in zip(left, right, strict=True))
