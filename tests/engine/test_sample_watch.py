"""A `Watch` on `EngineRun.sample`: it sees each token step as it is drawn, with the tokens'
logprobs at temperature 1 (the `logprobs` operation's bits) and their top alternatives (checked
against transformers + peft), changes no bit of the result, and may end rows early."""

from __future__ import annotations

import pytest
import torch

from whitney.local.engine import EngineRun, Step, Watch

from .helpers import hf_peft, trained_run

PROMPTS = ([256, 72, 105, 33], [256, 10, 20, 30])
TOP = 3


@pytest.fixture(scope="module")
def run() -> EngineRun:
    return trained_run(seed=21, steps=2, lr=1e-2, sampler="s0")


def requests() -> list[dict]:
    params = {"max_tokens": 10, "temperature": 0.7, "top_k": 30, "seed": 4}
    return [
        {"prompt": {"token_ids": list(p)}, "num_samples": 2, "sampling_params": params}
        for p in PROMPTS
    ]


def sequences(outputs: list) -> list[dict]:
    return [s for out in outputs for s in out.result["sequences"]]


def test_a_watch_sees_every_token_as_drawn_and_changes_no_bit(run: EngineRun) -> None:
    steps: list[Step] = []
    plain = sequences(run.sample("s0", requests(), [0, 0]))
    watched = sequences(
        run.sample("s0", requests(), [0, 0], Watch(lambda s: steps.append(s) or (), top=TOP))
    )
    assert watched == plain
    rows: dict[int, list[tuple[int, float, list[tuple[int, float]], str | None]]] = {}
    for step in steps:
        for row, token, lp, top, end in zip(
            step.rows, step.tokens, step.logprobs, step.top, step.ends, strict=True
        ):
            rows.setdefault(row, []).append((token, lp, top, end))
    reference = hf_peft(run)
    for row, seq in enumerate(plain):
        seen = rows[row]
        assert [t for t, *_ in seen] == seq["tokens"]
        assert [end for *_, end in seen] == [None] * (len(seen) - 1) + [seq["stop_reason"]]
        prompt = list(PROMPTS[row // 2])
        ids = prompt + seq["tokens"]
        (whitney,) = run.logprobs("s0", {"sequences": [{"token_ids": ids}]}).result["logprobs"]
        assert [lp for _, lp, *_ in seen] == whitney[len(prompt) :]  # bit for bit
        with torch.no_grad():
            logp = torch.log_softmax(reference(input_ids=torch.tensor([ids])).logits[0], -1)
        for k, (_, _, top, _) in enumerate(seen):
            values, order = logp[len(prompt) - 1 + k].sort(descending=True)
            assert [t for t, _ in top] == order[:TOP].tolist()
            assert [v for _, v in top] == pytest.approx(values[:TOP].tolist(), abs=1e-5)


def test_rows_a_watch_ends_stop_there_and_the_others_are_unchanged(run: EngineRun) -> None:
    plain = sequences(run.sample("s0", requests(), [0, 0]))

    steps: list[Step] = []

    def end_row_1_at_step_3(step: Step) -> list[int]:
        steps.append(step)
        return [1] if len(steps) == 3 else []

    cut = sequences(run.sample("s0", requests(), [0, 0], Watch(end_row_1_at_step_3)))
    assert len(plain[1]["tokens"]) > 3
    assert cut[1] == {
        "tokens": plain[1]["tokens"][:3],
        "logprobs": plain[1]["logprobs"][:3],
        "stop_reason": "stop",
    }
    assert [cut[0], *cut[2:]] == [plain[0], *plain[2:]]
