"""Independent references for the engine tests: transformers' LlamaForCausalLM and peft, built
from the engine's weights but computing everything themselves; the small trained runs the tests
check against them, and a probe in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from whitney.local.engine import EngineRun

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def hf_config(cfg) -> Any:
    """A LlamaConfig written out by hand from the engine's ModelConfig fields."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )


def hf_llama(cfg, weights: dict[str, torch.Tensor]) -> Any:
    import transformers

    model = transformers.LlamaForCausalLM(hf_config(cfg))
    model.load_state_dict({k: v.detach().clone() for k, v in weights.items()}, strict=True)
    return model.float().eval()


def hf_peft(run) -> Any:
    """peft LoRA (r, alpha = 2r, all seven projections) holding copies of the run's adapter."""
    import peft

    lora_config = peft.LoraConfig(
        r=run.lora.rank, lora_alpha=2 * run.lora.rank, target_modules=list(PROJ), lora_dropout=0.0
    )
    model = peft.get_peft_model(hf_llama(run.cfg, run.base_weights), lora_config)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, a in run.lora.A.items():
            module = modules[f"base_model.model.{name}"]
            module.lora_A["default"].weight.copy_(a)
            module.lora_B["default"].weight.copy_(run.lora.B[name])
    return model.eval()


def peft_param(model, name: str, which: str) -> torch.Tensor:
    """The peft parameter of module `name` (HF name) and `which` in {"lora_A", "lora_B"}."""
    module = dict(model.named_modules())[f"base_model.model.{name}"]
    return getattr(module, which)["default"].weight


def token_logprobs(model, ids: list[int], targets: list[int]) -> torch.Tensor:
    """log p(targets[t] | ids[:t+1]) from a transformers model, with autograd."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(targets)]


def tensor(values, dtype: str = "float32") -> dict:
    return {"dtype": dtype, "shape": [len(values)], "values": list(values)}


def datum(ids: list[int], targets: list[int], **loss_inputs: list[float]) -> dict:
    inputs = {"target_tokens": tensor(targets, "int64")}
    inputs |= {k: tensor(v) for k, v in loss_inputs.items()}
    return {"input": {"token_ids": list(ids)}, "loss_inputs": inputs}


def make_sequences(seed: int, count: int, lengths: tuple[int, int] = (6, 14)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen))
        out.append(torch.randint(0, 256, (n,), generator=gen).tolist())
    return out


def train_a_little(run, steps: int = 2, lr: float = 5e-3) -> None:
    """A few SFT steps so LoRA B is non-zero (gradients then reach A too)."""
    data = [datum(s[:-1], s[1:]) for s in make_sequences(99, 4)]
    for _ in range(steps):
        run.forward(
            {"data": data, "loss_function": "cross_entropy", "loss_config": {}}, backward=True
        )
        run.optim_step({"type": "adamw", "learning_rate": lr})


def trained_run(seed: int, steps: int = 2, lr: float = 5e-3, sampler: str = "") -> EngineRun:
    """A local/nano run (LoRA rank 4) after `train_a_little`; its weights saved for the
    sampler `sampler` when one is named."""
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=seed)
    train_a_little(run, steps=steps, lr=lr)
    if sampler:
        run.save_weights_for_sampler(sampler)
    return run


def python_json(code: str, env: dict[str, str], timeout: float, cwd: Path | None = None) -> Any:
    """What a fresh Python process running `code` prints last, as JSON; it must exit 0 (the
    assertion shows its stderr's tail)."""
    command = [sys.executable, "-c", code]
    completed = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.splitlines()[-1])
