"""Inline evaluation of the distillation (`eval_every`): the student trains the same with and
without it (adapter sha256), and its eval loss after the last cycle is, to the bit, the
flow's own `eval-end` measure of the same weights on the same held-out pairs; the rewards of
its greedy completions are their similarity to the held-out references (difflib, by hand)."""

from __future__ import annotations

import difflib
import statistics

from flowtest_distill import small_distill_config

from flows.core.records.inspection_journal import cycle_groups
from flows.distill.flow import distillation_flow
from flows.sft.corpus import builtin_examples
from flows.sft.plan import held_out
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


def test_inline_evaluation_of_the_student(
    whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    config = small_distill_config(whitney.url, cycles=1)
    without = distillation_flow(config)
    result = distillation_flow(config.model_copy(update={"eval_every": 5}))  # after the last
    assert result.adapter.sha256 == without.adapter.sha256
    assert [c.teacher_kl for c in result.cycles] == [c.teacher_kl for c in without.cycles]
    (last,) = result.cycles
    assert last.eval is not None
    assert last.eval.loss == result.eval.student_after  # eval-2 and eval-end: the same bits
    examples = builtin_examples()
    pairs = [examples[index] for index in sorted(held_out(examples, config.eval_fraction))]
    assert last.eval.prompts == len({pair.prompt for pair in pairs})
    assert last.eval.loss_tokens == result.eval.tokens

    groups = {
        group.label: group for group in cycle_groups(inspector.journal(result.run_id, limit=1000))
    }
    greedy = [op for op in groups["eval-0"].operations if op.kind == "sample"][: last.eval.prompts]
    references = {pair.prompt: pair.completion for pair in pairs}
    rewards = []
    for operation, prompt in zip(greedy, dict.fromkeys(pair.prompt for pair in pairs), strict=True):
        text = bytes(t for t in operation.result["sequences"][0]["tokens"] if t < 256).decode(
            errors="replace"
        )
        rewards.append(difflib.SequenceMatcher(None, text, references[prompt]).ratio())
    assert last.eval.reward_mean == statistics.fmean(rewards)
