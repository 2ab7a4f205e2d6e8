"""Each loss of docs/losses.md: value, metrics and the gradient of LoRA parameters against an
independent computation (transformers + peft forward, the formula written out here), with the
batch in one forward and with a forward (and its gradients) per datum."""

from __future__ import annotations

import math

import pytest
import torch

from whitney.errors import WhitneyError
from whitney.local.engine import EngineRun, runtime

from .helpers import datum, hf_peft, make_sequences, peft_param, token_logprobs, train_a_little

PROMPT = 4  # the first PROMPT tokens of every sequence are prompt (weight 0)
CHECKED = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj")
RATIOS = (0.5, 0.85, 1.0, 1.1, 1.3, 3.0, 5.0, 0.7)
ADVANTAGES = (1.0, -1.0, 0.5, -2.0, 1.5)


@pytest.fixture(autouse=True, params=["one forward", "a forward per datum"])
def chunking(request, monkeypatch) -> None:
    if request.param == "a forward per datum":
        monkeypatch.setattr(runtime, "CHUNK_TOKENS", 1)


@pytest.fixture(scope="module")
def policy() -> EngineRun:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=11)
    train_a_little(run)
    return run


@pytest.fixture(scope="module")
def reference(policy):
    return hf_peft(policy)


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    return make_sequences(7, 4, lengths=(10, 16))


def shifted(seq: list[int]) -> tuple[list[int], list[int], list[float]]:
    ids, targets = seq[:-1], seq[1:]
    return ids, targets, [0.0] * (PROMPT - 1) + [1.0] * (len(ids) - PROMPT + 1)


def reference_logprobs(reference, sequences, grad: bool = False) -> list[torch.Tensor]:
    with torch.set_grad_enabled(grad):
        return [token_logprobs(reference, *shifted(s)[:2]) for s in sequences]


def engine_grads(run: EngineRun, payload: dict):
    for p in run.trainable_parameters().values():
        p.grad = None
    out = run.forward(payload, backward=True)
    grads = {n: (run.lora.A[n].grad.clone(), run.lora.B[n].grad.clone()) for n in CHECKED}
    return out, grads


def check(run, reference, payload, ref_loss_fn, sequences):
    """Engine forward_backward vs the reference loss on peft logprobs: value and LoRA grads."""
    out, grads = engine_grads(run, payload)
    reference.zero_grad()
    lps = reference_logprobs(reference, sequences, grad=True)
    ref_loss = ref_loss_fn(lps)
    ref_loss.backward()
    assert out.result["loss"] == pytest.approx(ref_loss.item(), rel=1e-4, abs=1e-4)
    assert out.result["metrics"]["loss:sum"] == out.result["loss"]
    for n in CHECKED:
        for got, which in zip(grads[n], ("lora_A", "lora_B"), strict=True):
            want = peft_param(reference, n, which).grad
            assert want.abs().max() > 0, f"{n}.{which}: the reference gradient is zero"
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * want.abs().max().item())
    for o, lp in zip(out.result["outputs"], lps, strict=True):
        assert o["logprobs"] == pytest.approx(lp.tolist(), abs=1e-5)
    return out


def rl_inputs(lp0s, ratios=RATIOS, advantages=ADVANTAGES):
    """Per datum: weights, q = lp0 - log(target ratio), advantages, cycling the given values."""
    out = []
    for i, lp0 in enumerate(lp0s):
        n = len(lp0)
        w = [0.0] * (PROMPT - 1) + [1.0] * (n - PROMPT + 1)
        r = [ratios[(i + t) % len(ratios)] for t in range(n)]
        q = [lp0[t].item() - math.log(r[t]) for t in range(n)]
        a = [advantages[(2 * i + t) % len(advantages)] for t in range(n)]
        out.append({"weights": w, "logprobs": q, "advantages": a})
    return out


def payload(sequences, inputs, loss, config=None):
    data = [datum(*shifted(s)[:2], **x) for s, x in zip(sequences, inputs, strict=True)]
    return {"data": data, "loss_function": loss, "loss_config": config or {}}


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def wshare(flags, weights) -> float:
    pairs = zip(flags, weights, strict=True)
    num = sum(float(f) * w for fs, ws in pairs for f, w in zip(fs, ws, strict=True))
    return num / sum(sum(ws) for ws in weights)


def test_cross_entropy(policy, reference, sequences) -> None:
    inputs = [{"weights": shifted(s)[2]} for s in sequences]

    def ref(lps):
        return sum((-lp * t(x["weights"])).sum() for lp, x in zip(lps, inputs, strict=True))

    out = check(policy, reference, payload(sequences, inputs, "cross_entropy"), ref, sequences)
    assert out.result["metrics"]["tokens:sum"] == sum(sum(x["weights"]) for x in inputs)
    assert out.usage == {
        "tokens": sum(len(s) - 1 for s in sequences),
        "trained_tokens": sum(len(s) - 1 for s in sequences),
    }


def test_importance_sampling_with_ratio_clamp(policy, reference, sequences) -> None:
    lp0s = reference_logprobs(reference, sequences)
    inputs = rl_inputs(lp0s)
    inputs[0]["logprobs"][5] = lp0s[0][5].item() - 25.0  # ratio e^25: clamped to e^20
    inputs[1]["logprobs"][6] = lp0s[1][6].item() + 30.0  # ratio e^-30: clamped to e^-20

    def ref(lps):
        total = 0
        for lp, x in zip(lps, inputs, strict=True):
            r = torch.exp(torch.clamp(lp - t(x["logprobs"]), -20, 20))
            total = total + (-r * t(x["advantages"]) * t(x["weights"])).sum()
        return total

    out = check(
        policy, reference, payload(sequences, inputs, "importance_sampling"), ref, sequences
    )
    kl = sum(
        ((t(x["logprobs"]) - lp) * t(x["weights"])).sum()
        for lp, x in zip(lp0s, inputs, strict=True)
    )
    kl = kl / sum(sum(x["weights"]) for x in inputs)
    assert out.result["metrics"]["kl_sample_train:mean"] == pytest.approx(kl.item(), rel=1e-4)


def ppo_reference(inputs, lo_default, hi_default, lps):
    total, clipped = 0, []
    for lp, x in zip(lps, inputs, strict=True):
        lo = t(x.get("clip_low_threshold", [lo_default] * len(lp)))
        hi = t(x.get("clip_high_threshold", [hi_default] * len(lp)))
        r = torch.exp(torch.clamp(lp - t(x["logprobs"]), -20, 20))
        A = t(x["advantages"])
        term = -torch.minimum(r * A, torch.maximum(torch.minimum(r, hi), lo) * A)
        total = total + (term * t(x["weights"])).sum()
        clipped.append(((r < lo) | (r > hi)).tolist())
    return total, clipped


def test_ppo_both_clip_sides_and_per_token_thresholds(policy, reference, sequences) -> None:
    lp0s = reference_logprobs(reference, sequences)
    inputs = rl_inputs(lp0s)
    n = len(lp0s[2])
    inputs[2]["clip_low_threshold"] = [0.4] * n  # datum 2 overrides: 0.5 is no longer clipped
    inputs[2]["clip_high_threshold"] = [3.5] * n  # ... nor 1.3 and 3.0
    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.25}
    body = payload(sequences, inputs, "ppo", config)
    out = check(
        policy, reference, body, lambda lps: ppo_reference(inputs, 0.9, 1.25, lps)[0], sequences
    )
    _, clipped = ppo_reference(inputs, 0.9, 1.25, lp0s)
    share = wshare(clipped, [x["weights"] for x in inputs])
    assert 0 < share < 1
    assert out.result["metrics"]["clip_fraction:mean"] == pytest.approx(share)
    # the clipped branch of the min is taken on both sides: A > 0 with r > hi, A < 0 with r < lo
    sides = set()
    for lp0, x in zip(lp0s, inputs, strict=True):
        r = torch.exp(lp0 - t(x["logprobs"]))
        lo, hi = (
            x.get("clip_low_threshold", [0.9] * len(r)),
            x.get("clip_high_threshold", [1.25] * len(r)),
        )
        for k, (a, w) in enumerate(zip(x["advantages"], x["weights"], strict=True)):
            if w and a > 0 and r[k] > hi[k]:
                sides.add("high")
            if w and a < 0 and r[k] < lo[k]:
                sides.add("low")
    assert sides == {"high", "low"}


def test_ppo_defaults(policy, reference, sequences) -> None:
    lp0s = reference_logprobs(reference, sequences)
    inputs = rl_inputs(lp0s)
    body = payload(sequences, inputs, "ppo")
    check(policy, reference, body, lambda lps: ppo_reference(inputs, 0.8, 1.2, lps)[0], sequences)


def test_cispo(policy, reference, sequences) -> None:
    lp0s = reference_logprobs(reference, sequences)
    inputs = rl_inputs(lp0s)
    inputs[1]["clip_low_threshold"] = [0.6] * len(lp0s[1])  # per-token: 0.5 clips low here

    def ref(lps):
        total = 0
        for lp, x in zip(lps, inputs, strict=True):
            lo = t(x.get("clip_low_threshold", [0.0] * len(lp)))
            r = torch.exp(torch.clamp(lp - t(x["logprobs"]), -20, 20)).detach()
            coef = torch.maximum(torch.minimum(r, torch.tensor(4.0)), lo)
            total = total + (-coef * t(x["advantages"]) * lp * t(x["weights"])).sum()
        return total

    out = check(policy, reference, payload(sequences, inputs, "cispo"), ref, sequences)
    flags = []
    for lp, x in zip(lp0s, inputs, strict=True):
        lo = t(x.get("clip_low_threshold", [0.0] * len(lp)))
        r = torch.exp(lp - t(x["logprobs"]))
        flags.append(((r < lo) | (r > 4.0)).tolist())
    share = wshare(flags, [x["weights"] for x in inputs])
    assert 0 < share < 1
    assert out.result["metrics"]["clip_fraction:mean"] == pytest.approx(share)


def test_dro_quadratic_term(policy, reference, sequences) -> None:
    lp0s = reference_logprobs(reference, sequences)
    inputs = rl_inputs(lp0s, ratios=(0.3, 2.0, 0.9, 4.0))
    beta = 0.7

    def ref(lps):
        total = 0
        for lp, x in zip(lps, inputs, strict=True):
            q, A = t(x["logprobs"]), t(x["advantages"])
            total = total + (-(lp * A - 0.5 * beta * (lp - q) ** 2) * t(x["weights"])).sum()
        return total

    check(policy, reference, payload(sequences, inputs, "dro", {"beta": beta}), ref, sequences)
    # the quadratic term matters: beta = 0 gives a different loss
    out0 = policy.forward(payload(sequences, inputs, "dro", {"beta": 0.0}), backward=False)
    out1 = policy.forward(payload(sequences, inputs, "dro", {"beta": beta}), backward=False)
    quad = sum(
        (0.5 * beta * (lp - t(x["logprobs"])) ** 2 * t(x["weights"])).sum()
        for lp, x in zip(lp0s, inputs, strict=True)
    )
    assert out1.result["loss"] - out0.result["loss"] == pytest.approx(quad.item(), rel=1e-3)


def test_gspo_sequence_ratio(policy, reference, sequences) -> None:
    lp0s = reference_logprobs(reference, sequences)
    seq_ratios = (1.5, 0.6, 1.0, 1.1)  # datum 0 clips high, 1 clips low, 2 and 3 do not
    inputs = []
    for i, lp0 in enumerate(lp0s):
        n = len(lp0)
        w = [0.0] * (PROMPT - 1) + [1.0] * (n - PROMPT + 1)
        wobble = [0.3 * (-1) ** k for k in range(n)]  # token ratios differ; the mean is fixed
        q = [lp0[k].item() - math.log(seq_ratios[i]) - wobble[k] for k in range(n)]
        a = [ADVANTAGES[(i + k) % len(ADVANTAGES)] for k in range(n)]
        inputs.append({"weights": w, "logprobs": q, "advantages": a})
    # datum 3 gives its own mask: every completion token but the first
    inputs[3]["sequence_ratio_mask"] = [0.0] * PROMPT + [1.0] * (len(lp0s[3]) - PROMPT)

    def ref(lps):
        total = 0
        for lp, x in zip(lps, inputs, strict=True):
            q, A, w = t(x["logprobs"]), t(x["advantages"]), t(x["weights"])
            m = t(x["sequence_ratio_mask"]) if "sequence_ratio_mask" in x else (w != 0).float()
            log_s = ((lp.detach() - q) * m).sum() / m.sum()
            s = torch.exp(log_s + lp - lp.detach())
            term = -torch.minimum(s * A, torch.clamp(s, 0.8, 1.2) * A)
            total = total + (term * w).sum()
        return total

    out = check(policy, reference, payload(sequences, inputs, "gspo"), ref, sequences)
    w_all = [x["weights"] for x in inputs]
    flags = []
    for lp, x in zip(lp0s, inputs, strict=True):
        w = t(x["weights"])
        m = t(x["sequence_ratio_mask"]) if "sequence_ratio_mask" in x else (w != 0).float()
        s = torch.exp(((lp - t(x["logprobs"])) * m).sum() / m.sum())
        flags.append([bool(s < 0.8 or s > 1.2)] * len(lp))
    assert out.result["metrics"]["clip_fraction:mean"] == pytest.approx(wshare(flags, w_all))


def test_dppo_masking(policy, reference, sequences) -> None:
    lp0s = reference_logprobs(reference, sequences)
    p_min = min(lp.exp().min().item() for lp in lp0s)
    delta_high, delta_low = 0.5 * p_min, 0.005
    inputs, expected_masked = [], []
    for i, lp0 in enumerate(lp0s):
        n = len(lp0)
        w = [0.0] * (PROMPT - 1) + [1.0] * (n - PROMPT + 1)
        a = [ADVANTAGES[(i + k) % len(ADVANTAGES)] for k in range(n)]
        p = lp0.exp()
        # alternate mu far below p (p - mu > delta_high) and above p (mu - p > delta_low)
        mu = [p[k].item() * 0.1 if k % 2 == 0 else p[k].item() + 0.01 for k in range(n)]
        masked = [(a[k] > 0 and k % 2 == 0) or (a[k] < 0 and k % 2 == 1) for k in range(n)]
        inputs.append({"weights": w, "logprobs": [math.log(m) for m in mu], "advantages": a})
        expected_masked.append(masked)

    def ref(lps):
        total = 0
        for lp, x, masked in zip(lps, inputs, expected_masked, strict=True):
            r = torch.exp(torch.clamp(lp - t(x["logprobs"]), -20, 20))
            m = 1.0 - t([float(f) for f in masked])
            total = total + (-r * t(x["advantages"]) * m * t(x["weights"])).sum()
        return total

    config = {"delta_low": delta_low, "delta_high": delta_high}
    out = check(policy, reference, payload(sequences, inputs, "dppo", config), ref, sequences)
    share = wshare(expected_masked, [x["weights"] for x in inputs])
    assert 0.2 < share < 0.8
    assert out.result["metrics"]["masked_fraction:mean"] == pytest.approx(share)


def test_policy_run_refuses_critic_loss_and_unknown_losses(policy, sequences) -> None:
    inputs = [{"weights": shifted(s)[2]} for s in sequences]
    for loss in ("ppo_critic", "nope"):
        with pytest.raises(WhitneyError) as err:
            policy.forward(payload(sequences, inputs, loss), backward=True)
        assert err.value.type == "unsupported_loss"
    with pytest.raises(WhitneyError) as err:
        policy.forward(payload(sequences, inputs, "importance_sampling"), backward=True)
    assert err.value.type == "invalid_datum" and "data[0].loss_inputs.logprobs" in err.value.message


# --- critic ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def critic() -> EngineRun:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=5, role="critic")
    data = [
        {
            "input": {"token_ids": s[:-1]},
            "loss_inputs": {
                "values": {"values": [0.0] * (len(s) - 1)},
                "returns": {"values": [1.0] * (len(s) - 1)},
            },
        }
        for s in make_sequences(3, 3)
    ]
    run.forward({"data": data, "loss_function": "ppo_critic", "loss_config": {}}, backward=True)
    run.optim_step({"learning_rate": 1e-2})  # B != 0, so the LoRA A grads are not all zero
    return run


def critic_values(run, model, sequences, grad: bool):
    """V_t from the peft model's final hidden state and a copy of the run's value head."""
    w = run.value_head["value_head.weight"].detach().clone().requires_grad_(grad)
    b = run.value_head["value_head.bias"].detach().clone().requires_grad_(grad)
    out = []
    with torch.set_grad_enabled(grad):
        for s in sequences:
            hidden = model.base_model.model.model(input_ids=torch.tensor([s[:-1]]))
            out.append((hidden.last_hidden_state[0] @ w.T + b).squeeze(-1))
    return out, w


@pytest.mark.parametrize("loss", ["ppo_critic", "ppo"])
def test_ppo_critic_value_clipping(critic, sequences, loss) -> None:
    model = hf_peft(critic)
    v0s, _ = critic_values(critic, model, sequences, grad=False)
    c = 0.3
    offsets, returns_off = (0.5, -0.5, 0.1, -0.1, 0.8), (1.0, -1.0, 0.2, -0.4)
    inputs = []
    for i, v0 in enumerate(v0s):
        n = len(v0)
        w = [0.0] * (PROMPT - 1) + [1.0] * (n - PROMPT + 1)
        if i == 1:
            w = [x * 0.5 for x in w]  # fractional weights: a weighted mean per datum
        v_old = [v0[k].item() - offsets[(i + k) % 5] for k in range(n)]
        ret = [v0[k].item() + returns_off[(i + 2 * k) % 4] for k in range(n)]
        inputs.append({"weights": w, "values": v_old, "returns": ret})
    data = [
        {"input": {"token_ids": s[:-1]}, "loss_inputs": {k: {"values": v} for k, v in x.items()}}
        for s, x in zip(sequences, inputs, strict=True)
    ]
    for p in critic.trainable_parameters().values():
        p.grad = None
    out = critic.forward(
        {"data": data, "loss_function": loss, "loss_config": {"value_clip": c}}, backward=True
    )
    values, head = critic_values(critic, model, sequences, grad=True)
    per_datum, flags = [], []
    for v, x in zip(values, inputs, strict=True):
        v_old, R, w = t(x["values"]), t(x["returns"]), t(x["weights"])
        vc = v_old + torch.clamp(v - v_old, -c, c)
        err = torch.maximum((vc - R) ** 2, (v - R) ** 2)
        per_datum.append((err * w).sum() / w.sum())
        flags.append(((v - v_old).abs() > c).tolist())
    ref = 0.5 * torch.stack(per_datum).mean()
    ref.backward()
    assert out.result["loss"] == pytest.approx(ref.item(), rel=1e-4)
    torch.testing.assert_close(
        critic.value_head["value_head.weight"].grad, head.grad, rtol=1e-3, atol=1e-5
    )
    name = "model.layers.1.mlp.down_proj"
    want = peft_param(model, name, "lora_A").grad
    assert want.abs().max() > 0
    torch.testing.assert_close(
        critic.lora.A[name].grad, want, rtol=1e-3, atol=1e-4 * want.abs().max().item()
    )
    share = wshare(flags, [x["weights"] for x in inputs])
    assert 0 < share < 1
    assert out.result["metrics"]["values_clipfrac:mean"] == pytest.approx(share)
    for o, v in zip(out.result["outputs"], values, strict=True):
        assert o["values"] == pytest.approx(v.tolist(), abs=1e-5)


def test_critic_refuses_policy_losses_and_samplers(critic, sequences) -> None:
    inputs = [{"weights": shifted(s)[2]} for s in sequences]
    with pytest.raises(WhitneyError) as err:
        critic.forward(payload(sequences, inputs, "cross_entropy"), backward=True)
    assert err.value.type == "unsupported_loss"
    with pytest.raises(WhitneyError) as err:
        critic.save_weights_for_sampler("s")
    assert err.value.type == "invalid_request"
