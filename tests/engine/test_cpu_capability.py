"""A sequence's numbers are the same bits on AVX2 and AVX-512 CPUs: the engine run with its vector
code forced to each, in a fresh interpreter, gives the same base weights, logprobs, sampled tokens
and their logprobs, forward_backward outputs and loss, with its compiled kernels (waited for,
compiled for each CPU capability) and without them (`WHITNEY_ENGINE_COMPILE=0`). Forced means both
of the libraries that pick their code by the CPU: torch's own (ATEN_CPU_CAPABILITY) and MKL's
vector math, to which torch hands exp, log and sqrt (MKL_ENABLE_INSTRUCTIONS): forcing torch's
alone left MKL on AVX-512, so the check compared one machine with itself, and forced to both the
numbers differed until the engine computed exp, log and sqrt itself (`exact.exp`, `exact.log`,
`exact.sqrt_float32`). Forcing AVX-512 on a CPU without it kills the child with SIGILL, so the
check is skipped there, saying why. Gradients go through float32 BLAS, whose kernels the CPU
picks: they are not compared."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from .helpers import python_json

AVX512_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty where /proc/cpuinfo is unreadable)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


PROBE = """
import hashlib, json
import torch
from whitney.local.engine import kernels
from whitney.local.engine.runtime import EngineRun

compiled = kernels.STATE.wait()

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
    "compiled": compiled,
    "weights": hashlib.sha256(weights).hexdigest(),
    "logprobs": digest(logprobs.result),
    "sample": digest(sampled.result),
    "forward_backward": digest(trained.result),
}))
"""


def forced(code: str, capability: str, compile_flag: str, timeout: float) -> dict[str, str]:
    """What `code` prints (JSON with its "capability") in a fresh interpreter with torch's and
    MKL's code forced to `capability`, less that capability, checked."""
    env = {"ATEN_CPU_CAPABILITY": capability, "MKL_ENABLE_INSTRUCTIONS": capability.upper()}
    printed = python_json(
        code, os.environ | env | {"WHITNEY_ENGINE_COMPILE": compile_flag}, timeout
    )
    assert printed.pop("capability") == capability.upper()
    return printed


ON_AVX512 = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64" or not cpu_flags() >= AVX512_FLAGS,
    reason="needs x86-64 Linux with AVX-512 (avx512f/bw/vl/dq): torch forced to it dies of SIGILL",
)
"""Tests that force AVX2 and AVX-512 in turn run only where both exist."""


@ON_AVX512
@pytest.mark.timeout(1800)  # the kernels may compile cold, for each capability
@pytest.mark.parametrize("compile_flag", ["1", "0"])
def test_avx2_and_avx512_give_the_same_numbers(compile_flag: str) -> None:
    if compile_flag == "1" and shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler for the compiled kernels")
    avx2 = forced(PROBE, "avx2", compile_flag, 1800)
    avx512 = forced(PROBE, "avx512", compile_flag, 1800)
    assert avx2.pop("compiled") is avx512.pop("compiled") is (compile_flag == "1")
    assert avx2 == avx512


ROUND_TRIP = """
import json, os
from pathlib import Path
import torch
from torch._inductor import aoti_load_package
from whitney.local.engine import exact, kernels

def normalised(x, total):
    return (exact.exp(x).float().double() / total).float()

def examples():
    x = torch.rand(8, 67, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * -30
    return [(x, exact.exp(x).float().double().sum(-1, keepdim=True))]

path = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "round-trip.pt2"
kernels.export(kernels.Kernel(normalised, examples, None), path)
run = aoti_load_package(str(path)).loader.boxed_run
(args,) = examples()
want, (got,) = normalised(*args), run(list(args))
print(json.dumps({
    "capability": torch.backends.cpu.get_cpu_capability(),
    "differ": int(kernels.bits(want).ne(kernels.bits(got)).sum()),
}))
"""


@ON_AVX512
@pytest.mark.timeout(900)
def test_a_kernel_built_for_avx2_keeps_a_float32_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled kernel that rounds a float64 to float32 and widens it again, forced to AVX2 on
    an AVX-512 CPU, gives its eager function's bits in its vector loop (rows of 67): with
    Inductor's -march=native GCC used AVX-512 there and dropped the round trip."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler for the compiled kernels")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # compiled afresh
    assert forced(ROUND_TRIP, "avx2", "1", 900) == {"differ": 0}


ROOT_CORRECTION = """
import json, os
from pathlib import Path
import torch
from torch._inductor import aoti_load_package
from whitney.local.engine import kernels

def nudged_root(x):
    wide = x.double()
    r = (wide.sqrt() * (1 + 2.0**-24)).float()
    bits = r.view(torch.int32)
    up, down = (bits + 1).view(torch.float32), (bits - 1).view(torch.float32)
    root = r.double()
    above, below = (root + up.double()) * 0.5, (root + down.double()) * 0.5
    return torch.where(above * above < wide, up, torch.where(below * below > wide, down, r))

def examples():
    gen = torch.Generator().manual_seed(1)
    scale = 2.0 ** torch.randint(-120, 120, (4099,), generator=gen)
    return [((torch.rand(4099, generator=gen, dtype=torch.float64) * scale).float(),)]

path = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "root-correction.pt2"
kernels.export(kernels.Kernel(nudged_root, examples, None), path)
run = aoti_load_package(str(path)).loader.boxed_run
((x,),) = examples()
right = x.double().sqrt().float().view(torch.int32)
nudged = (x.double().sqrt() * (1 + 2.0**-24)).float().view(torch.int32)
(got,) = run([x])
print(json.dumps({
    "capability": torch.backends.cpu.get_cpu_capability(),
    "nudged": int(nudged.ne(right).sum()),
    "differ": int(got.view(torch.int32).ne(right).sum()),
}))
"""


@ON_AVX512
@pytest.mark.timeout(900)
def test_a_root_built_for_avx2_corrects_its_float32_guess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`exact.sqrt_float32`'s correction, compiled for AVX2 on an AVX-512 CPU, brings a float32
    guess one step above the root back, in its vector loop: here the guess is the float64 root
    nudged up by half a step or more, so the midpoints must come from the guess rounded to
    float32 (with Inductor's -march=native GCC used the unrounded float64 and 482 of the 4099
    roots were wrong). The right roots are float64's, rounded once (exact for float32's sqrt)."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler for the compiled kernels")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # compiled afresh
    found = forced(ROOT_CORRECTION, "avx2", "1", 900)
    assert found["nudged"] > 2000
    assert found["differ"] == 0
