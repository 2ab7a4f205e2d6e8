"""A sequence's numbers are the same bits on AVX2 and AVX-512 CPUs: the engine run with torch's
vector code forced to each (ATEN_CPU_CAPABILITY, in a fresh interpreter) gives the same base
weights, logprobs, sampled tokens and their logprobs, forward_backward outputs and loss. (On a
machine without AVX-512 torch falls back to AVX2 and the two runs are alike.) Gradients go
through float32 BLAS, whose kernels the CPU picks: they are not compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import hashlib, json
import torch
from whitney.local.engine.runtime import EngineRun

def digest(value):
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()

run = EngineRun.create(base_model="local/tiny", lora_rank=8, seed=3)
weights = b"".join(t.numpy().tobytes() for t in run.base_weights.values())
run.save_weights_for_sampler("s")
text = [256, *b"Q: What sound does the frog make?\\nA: The frog says croak.", 257]
logprobs = run.logprobs("s", {"sequences": [{"token_ids": text}, {"token_ids": text[:9]}]})
request = {"prompt": {"token_ids": text[:12]}, "num_samples": 6,
           "sampling_params": {"max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 5}}
(sampled,) = run.sample("s", [request], [1])
data = [{"input": {"token_ids": text[:-1]},
         "loss_inputs": {"target_tokens": {"dtype": "int64", "shape": [len(text) - 1],
                                           "values": text[1:]}}}]
trained = run.forward({"data": data, "loss_function": "cross_entropy"}, backward=True)
print(json.dumps({
    "capability": torch.backends.cpu.get_cpu_capability(),
    "weights": hashlib.sha256(weights).hexdigest(),
    "logprobs": digest(logprobs.result),
    "sample": digest(sampled.result),
    "forward_backward": digest(trained.result),
}))
"""


def probe(capability: str) -> dict[str, str]:
    environment = os.environ | {"ATEN_CPU_CAPABILITY": capability}
    completed = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(completed.stdout.splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86-64")
def test_avx2_and_avx512_give_the_same_numbers() -> None:
    avx2, avx512 = probe("avx2"), probe("avx512")
    assert avx2.pop("capability") == "AVX2"
    print(f"forced AVX2, and {avx512.pop('capability')} for avx512")
    assert avx2 == avx512
