"""The DPO flow's numbers against an independent computation: the exported adapter loaded by
transformers + PEFT, the DPO loss (label smoothing and the SFT term included) written here in
plain torch. The held-out DPO loss the flow records after its one step is torch's to 1e-5 on
those weights, and the adapter after that step is one AdamW step of torch's gradient of the
loss at the start (the base model: LoRA B zero, so only B moves)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from flowtest_settings import QUICK_RECOVERY
from peft import AutoPeftModelForCausalLM

from flows.cli.main import main
from flows.dpo.config import DPOConfig
from flows.dpo.flow import dpo_flow
from flows.dpo.pairs import SPLIT_SALT, Pair
from flows.dpo.plan import load_dpo_plan
from flows.sft.plan import held_out
from whitney.local import EmbeddedWhitney
from whitney.tokenizers import BOS_ID, EOS_ID

PAIRS = [
    ("2+3=", "5", "Let me think, it could be 6 or so."),
    ("4+4=", "8", "Hmm, maybe 9, adding is hard."),
    ("7+1=", "8", "I guess 7, but I am unsure."),
    ("6+3=", "9", "Probably 10, give or take."),
    ("5+5=", "10", "Around 11, I would say."),
    ("9+2=", "11", "Maybe 12 or 13, who knows."),
]
BETA, SMOOTHING, SFT_WEIGHT, LR, EPS = 0.5, 0.1, 0.5, 1e-3, 1e-8


def tokens(prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """The raw renderer's layout, by hand: BOS + the prompt's bytes, the answer's + EOS."""
    return [BOS_ID, *prompt.encode()], [*answer.encode(), EOS_ID]


def answer_logprob(model: torch.nn.Module, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """Sum of log p(answer tokens | prompt) under a transformers model, with autograd."""
    ids = prompt + answer
    logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    return logprobs[len(prompt) - 1 :].sum()


def dpo_terms(model, reference, pairs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean DPO loss, mean SFT NLL per chosen token, margins) of `pairs` under `model`,
    against the reference sums `reference` (pair -> (chosen, rejected))."""
    losses, nlls, margins = [], [], []
    for prompt, chosen, rejected in pairs:
        p, c = tokens(prompt, chosen)
        _, r = tokens(prompt, rejected)
        pc, pr = answer_logprob(model, p, c), answer_logprob(model, p, r)
        rc, rr = reference[prompt]
        m = BETA * ((pc - rc) - (pr - rr))
        losses.append(
            -(1 - SMOOTHING) * torch.nn.functional.logsigmoid(m)
            - SMOOTHING * torch.nn.functional.logsigmoid(-m)
        )
        nlls.append(-pc / len(c))
        margins.append(m)
    return torch.stack(losses).mean(), torch.stack(nlls).mean(), torch.stack(margins)


def dpo_config(whitney: EmbeddedWhitney, tmp_path: Path, cycles: int) -> DPOConfig:
    """The pairs in a JSONL file; one step a cycle on the four training pairs, no clipping."""
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return DPOConfig(
        api_url=whitney.url,
        base_model="local/tiny",
        data_path=str(data),
        cycles=cycles,
        pairs_per_cycle=4,
        eval_fraction=0.3,
        beta=BETA,
        label_smoothing=SMOOTHING,
        sft_weight=SFT_WEIGHT,
        learning_rate=LR,
        grad_clip_norm=0.0,
        seed=3,
        **QUICK_RECOVERY,
    )


def exported_model(whitney: EmbeddedWhitney, run_id: str, out: Path) -> torch.nn.Module:
    """The run's exported adapter on its base model, loaded by transformers + PEFT."""
    assert main(["export", run_id, "--out", str(out), "--api-url", whitney.url]) == 0
    return AutoPeftModelForCausalLM.from_pretrained(out).float().eval()


def lora(model: torch.nn.Module, kind: str) -> dict[str, torch.nn.Parameter]:
    """The model's LoRA `kind` ("lora_A" or "lora_B") parameters by name."""
    return {name: p for name, p in model.named_parameters() if kind in name}


def base_logprobs(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The reference: each pair's chosen and rejected logprob sums with LoRA B zero (the base
    model); B is zeroed in `model`."""
    with torch.no_grad():
        for parameter in lora(model, "lora_B").values():
            parameter.zero_()
        return {
            prompt: tuple(
                answer_logprob(model, *tokens(prompt, answer)) for answer in (chosen, rejected)
            )
            for prompt, chosen, rejected in PAIRS
        }


def split(fraction: float) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The training pairs and the held-out ones, as the flow splits them."""
    evaluated = held_out([Pair(p, c, r) for p, c, r in PAIRS], fraction, SPLIT_SALT)
    train = [pair for i, pair in enumerate(PAIRS) if i not in evaluated]
    return train, [pair for i, pair in enumerate(PAIRS) if i in evaluated]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # PEFT calls a deprecated API
def test_loss_and_step_match_plain_torch_on_the_exported_adapter(
    whitney: EmbeddedWhitney, tmp_path: Path
) -> None:
    config = dpo_config(whitney, tmp_path, cycles=1)
    train, held = split(config.eval_fraction)
    assert (len(train), len(held)) == (4, 2)
    plan = load_dpo_plan(config)  # the flow renders the pairs as the test does
    assert [(list(t.prompt), list(t.chosen)) for t in plan.train] == [
        tokens(p, c) for p, c, _ in train
    ]

    result = dpo_flow(config)
    (cycle,) = result.cycles
    assert cycle.kl_sample_train == 0.0  # forward and forward_backward: the same bits
    model = exported_model(whitney, result.run_id, tmp_path / "adapter")
    lora_b = lora(model, "lora_B")
    trained_b = {n: p.detach().clone() for n, p in lora_b.items()}

    # the start: the base model (B = 0); A did not move (its gradient is 0 while B is 0)
    base = base_logprobs(model)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parameter in lora_b.values():
        parameter.requires_grad_(True)
    dpo, nll, _ = dpo_terms(model, base, train)
    assert cycle.loss == pytest.approx(dpo.item(), abs=1e-5) == math.log(2)
    (dpo + SFT_WEIGHT * nll).backward()
    gradients = {n: p.grad.detach().clone() for n, p in lora_b.items()}
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in gradients.values())).item()
    assert cycle.grad_norm == pytest.approx(norm, rel=1e-4)
    for name, gradient in gradients.items():  # AdamW's first step from B = 0, no decay
        expected = -LR * gradient / (gradient.abs() + EPS)
        assert (trained_b[name] - expected).abs().max().item() <= LR * 1e-3, name
    assert max(g.abs().max().item() for g in gradients.values()) > 1e-3  # not vacuous

    # after the step: the held-out pairs' DPO loss and margins on the trained weights
    with torch.no_grad():
        for name, parameter in lora_b.items():
            parameter.copy_(trained_b[name])
        loss, _, margins = dpo_terms(model, base, held)
    after = result.eval_after
    assert after is not None and after.pairs == 2
    assert after.loss == pytest.approx(loss.item(), abs=1e-5)
    assert after.margin == pytest.approx(margins.mean().item(), rel=1e-5)  # float32 sums
    assert after.accuracy == (margins > 0).float().mean().item()
    assert abs(after.loss - math.log(2)) > 1e-3  # the step moved the held-out pairs


def adamw_update(
    gradients: list[torch.Tensor], beta1: float = 0.9, beta2: float = 0.95
) -> torch.Tensor:
    """AdamW's step (no decay) after the gradients of steps 1..t, by its definition: the
    bias-corrected first moment over the root of the second, times -LR."""
    first = second = torch.zeros_like(gradients[0], dtype=torch.float64)
    for gradient in gradients:
        first = beta1 * first + (1 - beta1) * gradient.double()
        second = beta2 * second + (1 - beta2) * gradient.double() ** 2
    t = len(gradients)
    corrected = first / (1 - beta1**t), second / (1 - beta2**t)
    return -LR * corrected[0] / (corrected[1].sqrt() + EPS)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # PEFT calls a deprecated API
def test_a_second_step_at_a_nonzero_margin_matches_plain_torch(
    whitney: EmbeddedWhitney, tmp_path: Path
) -> None:
    """After one step the policy is no longer the reference, so the second cycle's margins
    are not 0: its DPO loss and gradient norm are torch's at the weights after the first
    step (the one-cycle run's export), and the two-cycle run's adapter is those weights
    after AdamW's second step with torch's gradients of both steps."""
    train, _ = split(0.3)
    first_run = dpo_flow(dpo_config(whitney, tmp_path, cycles=1))
    second_run = dpo_flow(dpo_config(whitney, tmp_path, cycles=2))
    step_one = exported_model(whitney, first_run.run_id, tmp_path / "one")
    step_two = exported_model(whitney, second_run.run_id, tmp_path / "two")
    weights = {kind: lora(step_one, kind) for kind in ("lora_A", "lora_B")}
    after_one = {
        kind: {n: p.detach().clone() for n, p in params.items()} for kind, params in weights.items()
    }
    base = base_logprobs(step_one)  # zeroes B: the first step's gradient is at margin 0
    for parameter in step_one.parameters():
        parameter.requires_grad_(False)
    for params in weights.values():
        for parameter in params.values():
            parameter.requires_grad_(True)

    def gradients() -> tuple[float, dict[str, torch.Tensor], torch.Tensor]:
        """(DPO loss, the gradient of DPO + SFT of each LoRA parameter, margins) now."""
        step_one.zero_grad()
        dpo, nll, margins = dpo_terms(step_one, base, train)
        (dpo + SFT_WEIGHT * nll).backward()
        every = {**weights["lora_A"], **weights["lora_B"]}
        return dpo.item(), {n: p.grad.detach().clone() for n, p in every.items()}, margins

    _, first, margins = gradients()
    assert margins.abs().max().item() == 0.0
    with torch.no_grad():
        for kind, params in weights.items():
            for name, parameter in params.items():
                parameter.copy_(after_one[kind][name])
    loss, second, margins = gradients()

    (cycle,) = second_run.cycles[1:]
    assert margins.abs().min().item() > 1e-3  # a margin whose sign matters
    assert abs(loss - math.log(2)) > 1e-3
    assert cycle.loss == pytest.approx(loss, abs=1e-5)
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in second.values())).item()
    assert cycle.grad_norm == pytest.approx(norm, rel=1e-4)
    assert any(g.abs().max().item() > 1e-3 for n, g in second.items() if "lora_A" in n)

    trained = {**lora(step_two, "lora_A"), **lora(step_two, "lora_B")}
    start = {**after_one["lora_A"], **after_one["lora_B"]}
    worst = 0.0
    for name, parameter in trained.items():
        step = parameter.detach().double() - start[name].double()
        first_step = first[name] if "lora_B" in name else torch.zeros_like(first[name])
        expected = adamw_update([first_step, second[name]])
        worst = max(worst, (step - expected).abs().max().item())
    print(f"second AdamW step: worst difference {worst:.3g} (LR {LR:g})")
    assert worst <= LR * 1e-2
