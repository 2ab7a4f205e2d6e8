"""Builders for the export tests: a run trained over HTTP, the command run in-process, and the
two computations compared (the server's forward and sample, Hugging Face's forward and
generate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.cli.main import main
from whitney.client import WhitneyClient
from whitney.datums import sft_datum
from whitney.local import EmbeddedWhitney
from whitney.tokenizers import BOS_ID, EOS_ID, VOCAB_SIZE, ByteTokenizer

BYTES = ByteTokenizer()
PAIRS = [("Number: ", "42"), ("n=", "7"), ("Digits: ", "123"), ("x = ", "9000")]
"""What the run learns, in the flows' SFT layout (BOS + prompt, completion + EOS)."""


FORWARD_DATUMS = 64
"""Datums per `forward` of `server_log_probs`: 64 x 100 tokens is within the server's default
max_tokens_per_request (16384); the chunking changes no bit of the results."""


def new_client(server: EmbeddedWhitney) -> WhitneyClient:
    """A client of `server` with short backoffs."""
    return WhitneyClient(server.url, server.api_key, backoff_base=0.01, backoff_max=0.1)


def prompt_tokens(text: str) -> list[int]:
    """BOS + the UTF-8 bytes, as the flows build prompts."""
    return [BOS_ID, *BYTES.encode(text)]


def train(client: WhitneyClient, run_id: str, steps: int = 12, lr: float = 3e-3) -> None:
    """SFT steps on PAIRS: the adapter moves far from zero."""
    data = [
        sft_datum(prompt_tokens(prompt), [*BYTES.encode(completion), EOS_ID])
        for prompt, completion in PAIRS
    ]
    payload = {"data": data, "loss_function": "cross_entropy", "loss_config": {}}
    for _ in range(steps):
        client.run_operation(run_id, "forward_backward", payload)
        client.run_operation(
            run_id, "optim_step", {"optimizer": {"type": "adamw", "learning_rate": lr}}
        )


def new_trained_run(client: WhitneyClient, base_model: str = "local/nano") -> str:
    """A fresh run (its own session) after a few SFT steps; still active."""
    session = client.open_session({"test": "export"})
    run_id = client.create_run(session.session_id, "local", base_model, seed=5).run_id
    train(client, run_id)
    return run_id


def export(run_id: str, out: Path, *options: str, url: str, key: str) -> int:
    """`whitney-flows export RUN_ID --out OUT ...` against `url`, the key in WHITNEY_API_KEY."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WHITNEY_API_KEY", key)
        patch.delenv("WHITNEY_API_URL", raising=False)
        return main(["export", run_id, "--out", str(out), "--api-url", url, *options])


def server_log_probs(
    client: WhitneyClient, run_id: str, tokens: list[int], vocab: int = VOCAB_SIZE
) -> torch.Tensor:
    """log softmax [len(tokens), vocab] of the run's current weights, from `forward`: one
    datum per vocabulary id, that id the target at every position, FORWARD_DATUMS a call."""
    n = len(tokens)
    data = [
        {
            "input": {"token_ids": tokens},
            "loss_inputs": {
                "target_tokens": {"dtype": "int64", "shape": [n], "values": [v] * n},
                "weights": {"dtype": "float32", "shape": [n], "values": [1.0] * n},
            },
        }
        for v in range(vocab)
    ]
    outputs = []
    for start in range(0, vocab, FORWARD_DATUMS):  # within the server's tokens per request
        chunk = data[start : start + FORWARD_DATUMS]
        payload = {"data": chunk, "loss_function": "cross_entropy", "loss_config": {}}
        outputs += client.run_operation(run_id, "forward", payload)["outputs"]
    return torch.tensor([output["logprobs"] for output in outputs]).T


def hf_log_probs(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """log softmax [len(tokens), vocab] of a Hugging Face causal LM's own forward."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].log_softmax(-1)


def server_greedy(client: WhitneyClient, run_id: str, sampler_id: str, prompt: list[int], n: int):
    """The sampler's `sample` with top_k 1: `n` tokens at most (stops at EOS)."""
    request = {
        "prompt": {"token_ids": prompt},
        "num_samples": 1,
        "sampling_params": {"max_tokens": n, "top_k": 1, "seed": 0},
    }
    result = client.sampler_operation(run_id, sampler_id, "sample", request)
    return result["sequences"][0]["tokens"]
