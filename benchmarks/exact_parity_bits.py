"""How the engine's parity with transformers on SmolLM2 depends on the bits of its exact
projections: the largest difference of a target token's logprob, engine against transformers
in float64 (the truth) and in float32, with today's `exact.bits_for` (the same bits for both
operands) and with the bits a float64 product allows shared unevenly: the activation row
`--activation-bits`, the weight row the rest (the most bits b with K * 2**(a + b) <= 2**53,
so every partial sum is still an exact integer: the same cost, the same guarantees). An
experiment on the engine's arithmetic (it replaces `exact.linear` and `exact.weight` for the
run), for choosing the bits; the engine itself is unchanged.

    python benchmarks/exact_parity_bits.py [--model gguf/SmolLM2-135M-Instruct-Q4_1]
        [--activation-bits 24,25] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import sys
from unittest import mock

import torch
from torch import Tensor

from whitney import hf_cache
from whitney.local.engine import exact, hf_backend
from whitney.local.engine.model import Llama

CHATS = [
    [("user", "What is 3 + 4?"), ("assistant", "3 + 4 = 7")],
    [("user", "What is 8 + 1?"), ("assistant", "8 + 1 = 9")],
    [
        ("user", "Write a long, detailed story about a lighthouse keeper and a storm."),
        ("assistant", "The keeper climbed the stairs as the wind rose over the black water."),
    ],
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def product_bits(k: int) -> int:
    """The most a + b with k * 2**(a + b) <= 2**53 (operand rows of a and b bits)."""
    return math.floor(53 - math.log2(k))


def uneven(activation_bits: int) -> tuple[object, object]:
    """`exact.linear` and `exact.weight` with the activation row on `activation_bits` bits and
    the weight row on what is left of the product's 53."""

    def weight(w: Tensor) -> Tensor:
        return exact.fixed_point(w, product_bits(w.shape[-1]) - activation_bits)

    def linear(x: Tensor, w: Tensor) -> Tensor:
        return exact.matmul(exact.fixed_point(x, activation_bits), w)

    return linear, weight


def max_difference(left: list[Tensor], right: list[Tensor]) -> float:
    return max((a - b).abs().max().item() for a, b in zip(left, right, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gguf/SmolLM2-135M-Instruct-Q4_1")
    parser.add_argument("--activation-bits", default="24,25")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    snapshot = hf_cache.snapshot(args.model)
    if snapshot is None:
        raise SystemExit(f"--model: {args.model} is not in the Hugging Face cache")
    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    sequences = []
    for chat in CHATS:
        messages = [{"role": role, "content": content} for role, content in chat]
        ids = tokenizer.apply_chat_template(messages, tokenize=True)
        sequences.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    log("transformers float32 and float64 forwards ...")
    hf = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()

    def reference(model: torch.nn.Module) -> list[Tensor]:
        rows = []
        for ids in sequences:
            with torch.no_grad():
                logits = model(torch.tensor([ids[:-1]])).logits[0].double()
            rows.append(logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0])
        return rows

    float32 = reference(hf)
    truth = reference(hf.double())
    cfg, weights = hf_backend.load(args.model, snapshot)

    def engine() -> list[Tensor]:
        model = Llama(cfg, weights)
        with torch.no_grad():
            return [
                model.target_logprobs(
                    model.hidden(torch.tensor([ids[:-1]])), torch.tensor([ids[1:]])
                )[0].double()
                for ids in sequences
            ]

    print(f"model {args.model}, {sum(len(s) for s in sequences)} tokens in {len(CHATS)} chats")
    print(f"transformers float32 against float64: {max_difference(float32, truth):.2e}")
    runs = [("today: both operands bits_for(K)", None)]
    runs += [
        (f"activations {a} bits, weights the rest", a) for a in bit_counts(args.activation_bits)
    ]
    for name, bits in runs:
        log(f"engine, {name} ...")
        if bits is None:
            got = engine()
            detail = f"{exact.bits_for(576)}/{exact.bits_for(576)} (K=576), "
            detail += f"{exact.bits_for(1536)}/{exact.bits_for(1536)} (K=1536)"
        else:
            linear, weight = uneven(bits)
            with (
                mock.patch.object(exact, "linear", linear),
                mock.patch.object(exact, "weight", weight),
            ):
                got = engine()
            detail = f"{bits}/{product_bits(576) - bits} (K=576), "
            detail += f"{bits}/{product_bits(1536) - bits} (K=1536)"
        print(
            f"{name} [{detail}]: against float64 {max_difference(got, truth):.2e}, "
            f"against float32 {max_difference(got, float32):.2e}",
            flush=True,
        )


def bit_counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


if __name__ == "__main__":
    main()
