"""AdamW against a hand-written update and torch.optim.AdamW; grad clipping and pre-clip norm.
The engine's root of v is correctly rounded (numpy's float32 sqrt, the hardware's); torch's is
MKL's, which is not always: the two agree bit for bit on every element whose roots agree."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from whitney.errors import WhitneyError
from whitney.local.engine import EngineRun

from .helpers import datum, make_sequences

HP = {
    "type": "adamw",
    "learning_rate": 1e-2,
    "beta1": 0.8,
    "beta2": 0.9,
    "eps": 1e-6,
    "weight_decay": 0.1,
    "grad_clip_norm": 0.0,
}


def backward(run: EngineRun, seed: int) -> dict[str, torch.Tensor]:
    data = [datum(s[:-1], s[1:]) for s in make_sequences(seed, 3)]
    run.forward({"data": data, "loss_function": "cross_entropy", "loss_config": {}}, backward=True)
    return {n: p.grad.clone() for n, p in run.trainable_parameters().items()}


def by_hand(params, grads, state, hp, t):
    """AdamW written out: decoupled decay, moments, bias correction (t counts from 1)."""
    out = {}
    for n, p in params.items():
        g = grads[n]
        m = state.setdefault(("m", n), torch.zeros_like(p))
        v = state.setdefault(("v", n), torch.zeros_like(p))
        m = hp["beta1"] * m + (1 - hp["beta1"]) * g
        v = hp["beta2"] * v + (1 - hp["beta2"]) * g * g
        state[("m", n)], state[("v", n)] = m, v
        m_hat = m / (1 - hp["beta1"] ** t)
        v_hat = v / (1 - hp["beta2"] ** t)
        p = p * (1 - hp["learning_rate"] * hp["weight_decay"])
        out[n] = p - hp["learning_rate"] * m_hat / (v_hat.sqrt() + hp["eps"])
    return out


def test_two_steps_match_hand_written_and_torch_adamw() -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=3)
    params = {n: p.detach().clone() for n, p in run.trainable_parameters().items()}
    torch_params = {n: p.clone().requires_grad_() for n, p in params.items()}
    torch_opt = torch.optim.AdamW(
        list(torch_params.values()),
        lr=HP["learning_rate"],
        betas=(HP["beta1"], HP["beta2"]),
        eps=HP["eps"],
        weight_decay=HP["weight_decay"],
        foreach=False,
    )
    state: dict = {}
    roots_differed = {n: torch.zeros_like(p, dtype=torch.bool) for n, p in params.items()}
    for t in (1, 2):
        grads = backward(run, seed=t)
        out = run.optim_step(HP)
        assert out.result["step"] == t and run.step == t
        assert out.result["metrics"]["learning_rate"] == HP["learning_rate"]
        norm = math.sqrt(sum((g.double() ** 2).sum().item() for g in grads.values()))
        assert out.result["metrics"]["grad_norm"] == pytest.approx(norm, rel=1e-5)
        params = by_hand(params, grads, state, HP, t)
        for n, p in torch_params.items():
            p.grad = grads[n]
        torch_opt.step()
        for n, p in run.trainable_parameters().items():
            v = torch_opt.state[torch_params[n]]["exp_avg_sq"]
            roots_differed[n] |= torch.from_numpy(np.sqrt(v.numpy()) != v.sqrt().numpy())
            assert p.grad is None
            torch.testing.assert_close(p.detach(), params[n], rtol=1e-5, atol=1e-7)
            same = ~roots_differed[n]
            assert torch.equal(p.detach()[same], torch_params[n].detach()[same]), n
    assert any(not torch.equal(run.lora.B[n], torch.zeros_like(run.lora.B[n])) for n in run.lora.B)


def test_grad_clipping_uses_and_reports_the_pre_clip_norm() -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=3)
    params = {n: p.detach().clone() for n, p in run.trainable_parameters().items()}
    grads = backward(run, seed=1)
    norm = math.sqrt(sum((g.double() ** 2).sum().item() for g in grads.values()))
    hp = HP | {"grad_clip_norm": norm / 4, "eps": 1e-3}  # a large eps: the step scales with g
    out = run.optim_step(hp)
    assert out.result["metrics"]["grad_norm"] == pytest.approx(norm, rel=1e-5)
    clipped = {n: g * (hp["grad_clip_norm"] / (norm + 1e-6)) for n, g in grads.items()}
    expected = by_hand(params, clipped, {}, hp, 1)
    unclipped = by_hand(params, grads, {}, hp, 1)
    for n, p in run.trainable_parameters().items():
        torch.testing.assert_close(p.detach(), expected[n], rtol=1e-5, atol=1e-7)
    gap = max((expected[n] - unclipped[n]).abs().max().item() for n in expected)
    assert gap > 1e-4  # clipping changed the update materially


def test_step_without_gradients_and_bad_optimizer() -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=2, seed=3)
    out = run.optim_step({"learning_rate": 1e-3})
    assert out.result == {"step": 1, "metrics": {"grad_norm": 0.0, "learning_rate": 1e-3}}
    for bad in ({"type": "sgd"}, {"learning_rate": float("nan")}, {"beta1": 1.0}):
        with pytest.raises(WhitneyError) as err:
            run.optim_step(bad)
        assert err.value.type == "invalid_request"
    assert run.step == 1
