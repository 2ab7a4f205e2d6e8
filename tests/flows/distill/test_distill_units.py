"""The distillation's arithmetic against hand computations, its config checks, and the plan:
prompts, the eval split, the per-cycle usage bound. No Whitney, no flow runs."""

from __future__ import annotations

import pytest

from flows.core.config import ConfigError
from flows.core.evaluation.plan import completion_logprobs
from flows.distill.config import DistillationConfig
from flows.distill.plan import (
    check_distill_config,
    chunked,
    reverse_kl_advantages,
)
from flows.sft.config import SFTConfig
from flows.sft.corpus import builtin_examples
from flows.sft.plan import held_out, load_data


def test_reverse_kl_advantages_by_hand() -> None:
    student = [-1.0, -2.0, -0.5]
    teacher = [-1.5, -1.0, -0.5]
    # -kl_coef * (s - t): -(0.5), -(-1.0), -(0.0), times 2
    assert reverse_kl_advantages(student, teacher, 2.0) == [-1.0, 2.0, -0.0]
    # discounted: a_t = r_t + d * a_{t+1}, with d = 0.5: a2 = 0, a1 = 2, a0 = -1 + 1 = 0
    assert reverse_kl_advantages(student, teacher, 2.0, 0.5) == [0.0, 2.0, 0.0]
    # discount 1: the sum of the rest of the completion
    assert reverse_kl_advantages(student, teacher, 1.0, 1.0) == [0.5, 1.0, 0.0]


def test_completion_logprobs_and_chunks() -> None:
    row = [None, -0.1, -0.2, -0.3, -0.4]  # prompt of 2 tokens, completion of 3
    assert completion_logprobs(row, 2, 3) == [-0.2, -0.3, -0.4]
    with pytest.raises(ValueError, match="no 4 completion logprobs"):
        completion_logprobs(row, 2, 4)
    with pytest.raises(ValueError):
        completion_logprobs(row, 0, 2)  # the first entry is null: not a completion token
    assert chunked(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert chunked(list(range(7)), 0) == [list(range(7))]
    assert chunked([], 4) == []


def test_teacher_chunks_and_a_checkpoint_over_sft() -> None:
    config = DistillationConfig(prompts_per_cycle=8, group_size=4, teacher_chunk_size=5)
    assert config.sequences_per_cycle == 32
    assert config.teacher_chunks == 7
    assert config.model_copy(update={"teacher_chunk_size": 0}).teacher_chunks == 1
    with_checkpoint = config.model_copy(
        update={"teacher_sft": SFTConfig(), "teacher_checkpoint": "whitney://runs/r/states/x"}
    )
    assert with_checkpoint.teacher_sft_config() is None


def test_the_sft_teacher_runs_where_and_on_what_the_teacher_does() -> None:
    config = DistillationConfig(
        api_url="http://127.0.0.1:9",
        base_model="local/nano",
        lora_rank=4,
        teacher_sft=SFTConfig(steps=7),
        metrics_path="/tmp/m.jsonl",
    )
    sft = config.teacher_sft_config()
    assert sft is not None
    assert (sft.api_url, sft.base_model, sft.lora_rank, sft.steps) == (
        "http://127.0.0.1:9",
        "local/nano",
        4,
        7,
    )
    assert sft.metrics_path == "/tmp/m-teacher-sft.jsonl"


def test_corpus_prompts_exclude_the_eval_split_the_sft_flow_holds_out() -> None:
    config = DistillationConfig(base_model="local/nano")
    plan = check_distill_config(config)
    examples = builtin_examples()
    evaluated = held_out(examples, config.eval_fraction)
    eval_prompts = {examples[i].prompt for i in evaluated}
    assert len(plan.eval_set) == len(evaluated) == len(load_data(SFTConfig()).eval)
    seen = set()
    for cycle in range(20):
        requests = plan.sample_requests(cycle)
        assert len(requests) == config.prompts_per_cycle
        for request in requests:
            assert request["num_samples"] == config.group_size
            assert request["sampling_params"]["temperature"] == 1.0
            seen.add(plan.renderer.tokenizer.decode(request["prompt"]["token_ids"]))
    train_prompts = {example.prompt for example in examples} - eval_prompts
    assert seen <= train_prompts
    assert plan.sample_requests(3) == plan.sample_requests(3)  # a replay sends the same


def test_the_cycle_usage_bound_is_every_completion_at_max_tokens() -> None:
    config = DistillationConfig(
        base_model="local/nano", prompts_per_cycle=2, group_size=3, max_tokens=10
    )
    plan = check_distill_config(config)
    lengths = [len(r["prompt"]["token_ids"]) for r in plan.sample_requests(0)]
    bound = plan.cycle_usage_bound(0)
    assert bound["sample"]["tokens"] == sum(p + 30 for p in lengths)
    assert bound["logprobs"]["tokens"] == sum(3 * (p + 10) for p in lengths)
    assert bound["forward_backward"]["tokens"] == sum(3 * (p + 9) for p in lengths)


def test_eval_loss_is_the_mean_negative_logprob_of_completion_tokens() -> None:
    plan = check_distill_config(DistillationConfig(base_model="local/nano"))
    rows = []
    for sequence in plan.eval_set:
        rows.append(
            [None] + [-1.0] * (len(sequence.prompt) - 1) + [-2.0] * len(sequence.completion)
        )
    loss, tokens = plan.eval_loss(rows)
    assert loss == pytest.approx(2.0)
    assert tokens == sum(len(sequence.completion) for sequence in plan.eval_set)


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"teacher_base_model": "hf:some/model"}, "teacher_base_model"),
        ({"prompts": "nowhere"}, "prompts"),
        ({"prompts": "quiz"}, "prompts"),  # multi-turn: no prompts()
        ({"provider": "tinker", "base_model": "hf:x"}, "base_model"),
        ({"teacher_sft": {"steps": 5, "batch_size": 1, "max_example_tokens": 3}}, "teacher_sft."),
    ],
)
def test_bad_configs_fail_closed_naming_the_field(update: dict, field: str) -> None:
    config = DistillationConfig.model_validate({"base_model": "local/nano", **update})
    with pytest.raises(ConfigError) as error:
        check_distill_config(config)
    assert error.value.field.startswith(field), error.value


def test_environment_prompts_have_no_eval_set() -> None:
    plan = check_distill_config(DistillationConfig(base_model="local/nano", prompts="digits"))
    assert plan.eval_set == []
    assert len(plan.sample_requests(0)) == 8


def test_config_refuses_bad_values() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        DistillationConfig(teacher_checkpoint="s3://bucket/thing")
    with pytest.raises(ValidationError):
        DistillationConfig(discount=1.5)
    with pytest.raises(ValidationError):
        DistillationConfig(task_runner="ray")
    with pytest.raises(ValidationError, match="resume_from"):
        DistillationConfig(teacher_sft={"resume_from": "whitney://runs/r/states/cycle-1"})
