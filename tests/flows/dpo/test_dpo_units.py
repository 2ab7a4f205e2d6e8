"""The DPO arithmetic and pairs, without a server: the per-pair weight is the derivative of
the loss (checked by finite differences), the advantages carry it and the SFT share, the
sigmoid is stable at large margins, a cycle's pairs are a per-epoch permutation, and a
conversation prompt renders as the chat it is."""

from __future__ import annotations

import pytest

from flows.core.config import ConfigError
from flows.dpo.config import DPOConfig
from flows.dpo.objective import (
    PairLogprobs,
    log_sigmoid,
    margin,
    pair_advantages,
    pair_loss,
    pair_weight,
    preference_stats,
)
from flows.dpo.pairs import parse_pairs
from flows.dpo.plan import load_dpo_plan


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chosen", [-3.0, -0.2, 0.0, 0.7, 4.0])
def test_the_weight_is_minus_the_loss_derivative_in_the_chosen_logprob(
    smoothing: float, chosen: float
) -> None:
    beta, pairs, step = 0.4, 3, 1e-6

    def loss(pc: float) -> float:
        return pair_loss(margin(PairLogprobs(pc, -2.0, -1.0, -1.5), beta), smoothing) / pairs

    derivative = (loss(chosen + step) - loss(chosen - step)) / (2 * step)
    m = margin(PairLogprobs(chosen, -2.0, -1.0, -1.5), beta)
    assert pair_weight(m, beta, smoothing, pairs) == pytest.approx(-derivative, rel=1e-6, abs=1e-9)


def test_the_advantages_carry_the_weight_and_the_sft_share() -> None:
    chosen, rejected = pair_advantages(
        0.0, 4, 2, beta=0.5, label_smoothing=0.0, sft_weight=2.0, pairs=2
    )
    assert chosen == [0.5 * 0.5 / 2 + 2.0 / (2 * 4)] * 4
    assert rejected == [-0.5 * 0.5 / 2] * 2


def test_large_margins_neither_overflow_nor_lose_the_loss() -> None:
    assert log_sigmoid(1000.0) == 0.0 and log_sigmoid(-1000.0) == -1000.0
    assert pair_loss(-800.0, 0.0) == pytest.approx(800.0)
    assert pair_weight(800.0, 1.0, 0.0, 1) == 0.0


def test_preference_stats() -> None:
    pairs = [PairLogprobs(-1.0, -5.0, -2.0, -4.0), PairLogprobs(-3.0, -1.0, -2.0, -2.0)]
    stats = preference_stats(pairs, beta=0.5, label_smoothing=0.0)
    assert stats.accuracy == 0.5 and stats.pairs == 2 and stats.chosen_preferred == 0.5
    assert stats.margin == pytest.approx((0.5 * (1 + 1) + 0.5 * (-1 - 1)) / 2)
    assert stats.chosen_drift == pytest.approx(0.0) and stats.rejected_drift == pytest.approx(0.0)
    assert stats.loss == pytest.approx((-log_sigmoid(1.0) - log_sigmoid(-1.0)) / 2)


def write_pairs(tmp_path, count: int) -> str:
    path = tmp_path / "pairs.jsonl"
    lines = [f'{{"prompt": "{i}+1=", "chosen": "{i + 1}", "rejected": "no"}}' for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_every_training_pair_once_per_epoch(tmp_path) -> None:
    config = DPOConfig(data_path=write_pairs(tmp_path, 10), pairs_per_cycle=3, eval_fraction=0.2)
    plan = load_dpo_plan(config)
    assert (len(plan.train), len(plan.eval)) == (8, 2)
    stream = [index for cycle in range(8) for index in plan.batch(cycle)]
    assert sorted(stream[:8]) == sorted(stream[8:16]) == list(range(8))
    assert stream[:8] != stream[8:16]  # shuffled anew each epoch
    assert plan.batch(5) == load_dpo_plan(config).batch(5)


def test_a_conversation_prompt_renders_before_each_answer(tmp_path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text(
        '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", '
        '"content": "1+1?"}], "chosen": "2", "rejected": "Two, I believe, or so."}\n'
        '{"prompt": "2+2?", "chosen": "4", "rejected": "Five."}\n'
    )
    plan = load_dpo_plan(DPOConfig(data_path=str(path), eval_fraction=0))
    first = plan.train[0]
    assert b"Be brief." in bytes(t for t in first.prompt if t < 256)
    assert bytes(t for t in first.chosen if t < 256) == b"2"


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"prompt": "a", "chosen": "b", "rejected": "b"}', "are the same answer"),
        ('{"prompt": "a", "chosen": 3, "rejected": "b"}', "field 'chosen' must be a string"),
        ('{"messages": [], "chosen": "a", "rejected": "b"}', "messages must be a non-empty"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_lines_name_the_field_and_line(line: str, needle: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_pairs('{"prompt": "x", "chosen": "y", "rejected": "z"}\n' + line, "p.jsonl")
    assert error.value.field == "data_path"
    assert error.value.message.startswith("p.jsonl line 2: ") and needle in error.value.message
