"""The compiled kernels give the eager engine's bits: the same work in two fresh interpreters,
one with the kernels compiled (waited for) and one with `WHITNEY_ENGINE_COMPILE=0`, on
`local/tiny` and on a small Llama built here (grouped-query attention, q/k/v biases, a head
size whose 1/sqrt is no power of two): forward outputs, logprobs, sampled tokens and their
logprobs, forward_backward's outputs, loss and gradients, and a training step's adapter and
the forward after it, compared as raw bytes; while the kernels compile and load, torch code
beside them (AdamW) runs as it does without them. The kernels are the user's, as every engine
run's: compiled by whichever run of the session comes first (the others wait for its lock), so
the suite compiles them once. Off or without a compiler, the engine says so once and runs
eager."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from .helpers import python_json

PROBE = """
import hashlib, json, logging, sys, time
import torch
from whitney.local.engine import kernels
from whitney.local.engine.lora import Lora
from whitney.local.engine.model import ModelConfig, init_weights
from whitney.local.engine.runtime import EngineRun

params = [torch.randn(64, generator=torch.Generator().manual_seed(n)) for n in range(4)]

def adamw():
    copies = [p.clone().requires_grad_() for p in params]
    for p in copies:
        p.grad = p.detach().sin()
    torch.optim.AdamW(copies, lr=1e-2, foreach=False).step()
    return [p.detach() for p in copies]

# while the kernels compile and load, torch code beside them runs as without them (tracing in
# this process would set torch's process-wide is_compiling(): AdamW took its compiled path)
reference = adamw()
kernels.STATE.start()
compiling = differed = 0
while not kernels.STATE.done.is_set():
    compiling += torch.compiler.is_compiling()
    differed += any(not torch.equal(a, b) for a, b in zip(adamw(), reference))
    time.sleep(0.005)  # a poll, not a busy loop: the compiling child runs at the lowest priority
compiled = kernels.STATE.wait()
for kernel in kernels.STATE.kernels:
    kernel.eager_from = None  # every call compiled, however large
found = {"compiled": compiled, "compiling seen": compiling, "adamw differed": differed}

def digest(value):
    if isinstance(value, torch.Tensor):
        return hashlib.sha256(value.detach().contiguous().numpy().tobytes()).hexdigest()
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()

def exercise(name, run):
    run.save_weights_for_sampler("s")
    text = [256, *b"Q: What sound does the frog make?\\nA: The frog says croak.", 257]
    short = [256, *b"1 + 2 = 3"]
    lp = run.logprobs("s", {"sequences": [{"token_ids": text}, {"token_ids": short}]})
    found[name + " logprobs"] = digest(lp.result)
    requests = [
        {"prompt": {"token_ids": text[:12]}, "num_samples": 5,
         "sampling_params": {"max_tokens": 20, "temperature": 1.0, "seed": 5}},
        {"prompt": {"token_ids": short}, "num_samples": 1,
         "sampling_params": {"max_tokens": 9, "temperature": 0.8, "top_p": 0.9, "seed": 2}},
    ]
    found[name + " sample"] = digest([o.result for o in run.sample("s", requests, [1, 2])])
    def tensor(values, dtype="float32"):
        return {"dtype": dtype, "shape": [len(values)], "values": values}
    data = [
        {"input": {"token_ids": t[:-1]},
         "loss_inputs": {"target_tokens": tensor(t[1:], "int64"),
                         "weights": tensor([0.0] * 3 + [1.0] * (len(t) - 4)),
                         "logprobs": tensor([-2.0] * (len(t) - 1)),
                         "advantages": tensor([0.5] * (len(t) - 1))}}
        for t in (text, short)
    ]
    payload = {"data": data, "loss_function": "importance_sampling"}
    found[name + " forward"] = digest(run.forward(payload, backward=False).result)
    found[name + " forward_backward"] = digest(run.forward(payload, backward=True).result)
    found[name + " gradients"] = {
        n: digest(p.grad) for n, p in run.trainable_parameters().items() if p.grad is not None
    }
    run.optim_step({"type": "adamw", "learning_rate": 1e-2})
    found[name + " adapter"] = {n: digest(p) for n, p in run.trainable_parameters().items()}
    found[name + " after step"] = digest(run.forward(payload, backward=False).result)

exercise("tiny", EngineRun.create(base_model="local/tiny", lora_rank=8, seed=3))
cfg = ModelConfig(hidden_size=96, num_layers=2, num_heads=6, num_kv_heads=2, head_dim=24,
                  intermediate_size=160, architecture="qwen2", attention_bias=True)
weights = init_weights(cfg, seed=7)
gen = torch.Generator().manual_seed(8)
for name, w in weights.items():
    if name.endswith(".bias"):
        weights[name] = torch.randn(w.shape, generator=gen) * 0.1
lora = Lora.init(cfg, 4, seed=9)
for b in lora.B.values():
    b.copy_(torch.randn(b.shape, generator=gen) * 0.01)
exercise("small", EngineRun("built", cfg, weights, lora, "policy", True, {}, "built"))
print(json.dumps(found))
"""


def probe(compile_flag: str) -> dict:
    environment = os.environ | {"WHITNEY_ENGINE_COMPILE": compile_flag}
    return python_json(PROBE, environment, timeout=1800)


@pytest.mark.timeout(1800)  # the kernels may compile cold, on a busy machine
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_compiled_kernels_give_the_eager_bits() -> None:
    compiled, eager = probe("1"), probe("0")
    assert compiled.pop("compiled") is True
    assert eager.pop("compiled") is False
    assert (compiled.pop("compiling seen"), compiled.pop("adamw differed")) == (0, 0)
    assert (eager.pop("compiling seen"), eager.pop("adamw differed")) == (0, 0)
    assert len(compiled["tiny gradients"]) == 2 * 7 * 4  # A and B of every projection
    assert compiled == eager


SAY = """
import logging
from whitney.local.engine.runtime import EngineRun
logging.basicConfig(level=logging.WARNING, format="%(message)s")
run = EngineRun.create(base_model="local/tiny", lora_rank=4, seed=1)
run.save_weights_for_sampler("s")
for _ in range(2):
    run.logprobs("s", {"sequences": [{"token_ids": [256, 1, 2, 3]}]})
"""


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ({"WHITNEY_ENGINE_COMPILE": "0"}, "compiled kernels off (WHITNEY_ENGINE_COMPILE=0)"),
        ({"CXX": "no-such-compiler"}, "no C++ compiler (no-such-compiler) for compiled kernels"),
    ],
)
def test_off_or_without_a_compiler_it_runs_eager_and_says_so_once(setting, reason) -> None:
    environment = os.environ | setting
    if "CXX" in setting:
        environment.pop("WHITNEY_ENGINE_COMPILE", None)
    completed = subprocess.run(
        [sys.executable, "-c", SAY], env=environment, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    said = [line for line in completed.stderr.splitlines() if "running eager" in line]
    assert said == [f"engine: {reason}; running eager (the same bits)"]


PINNED = """
import json, sys
from pathlib import Path
import torch
from torch._inductor import aoti_load_package, cpp_builder
from whitney.local.engine import kernels

def contracted(a, b, c):
    return a * b + c  # a fused multiply-add rounds once: other bits

def examples():
    gen = torch.Generator().manual_seed(0)
    return [tuple(torch.randn(64, 256, generator=gen) for _ in range(3))]

def differing(directory):
    directory.mkdir()
    kernels.export(kernels.Kernel(contracted, examples, None), directory / "k.pt2")
    args = examples()[0]
    got = aoti_load_package(str(directory / "k.pt2")).loader.boxed_run(list(args))[0]
    return int((got.view(torch.int32) != contracted(*args).view(torch.int32)).sum())

configure, kernels.configure = kernels.configure, lambda: None
unpinned = differing(Path(sys.argv[1]) / "unpinned")  # the flags the environment sets
kernels.configure = configure
pinned = differing(Path(sys.argv[1]) / "pinned")
flags = cpp_builder._get_ffast_math_flags()  # those the compile used
capability = torch.backends.cpu.get_cpu_capability()
print(json.dumps({"pinned": pinned, "unpinned": unpinned, "flags": flags, "cpu": capability}))
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_the_environment_cannot_change_a_kernels_bits(tmp_path) -> None:
    """With Inductor's environment asking for contraction into fused multiply-adds and unsafe
    math, a kernel compiled by `export` still gives its eager function's bits (the same kernel
    compiled with the environment's flags does not, where the CPU has fused multiply-adds)."""
    environment = os.environ | {
        "TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG": "fast",
        "TORCHINDUCTOR_CPP_ENABLE_UNSAFE_MATH_OPT_FLAG": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    code = PINNED.replace("sys.argv[1]", repr(str(tmp_path)))
    found = python_json(code, environment, timeout=300)
    assert found["pinned"] == 0
    assert "ffp-contract=off" in found["flags"]
    assert "fno-unsafe-math-optimizations" in found["flags"]
    if found["cpu"] in ("AVX2", "AVX512"):  # compiled with -mfma: gcc contracts
        assert found["unpinned"] > 0


@pytest.mark.timeout(1800)  # the kernels may compile cold, on a busy machine
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_the_compile_command_compiles_and_loads_them() -> None:
    """`python -m whitney.local.engine.compile` (which the suite starts at its start) leaves the
    kernels compiled in the cache and loaded; off, it says the engine runs eager."""
    command = [sys.executable, "-m", "whitney.local.engine.compile"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith("engine kernels: compiled and loaded in ")
    environment = os.environ | {"WHITNEY_ENGINE_COMPILE": "0"}
    off = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    assert off.returncode == 0, off.stderr[-3000:]
    assert off.stdout == (
        "engine kernels: compiled kernels off (WHITNEY_ENGINE_COMPILE=0);"
        " the engine runs eager (the same bits)\n"
    )
