"""The SFT data: the built-in corpus is its generator's output, JSONL errors name the line,
tokenization is BOS + prompt and completion + EOS, the eval split depends on the text only,
and every step's batch is a pure function of (seed, step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.core.config import ConfigError
from flows.sft import corpus
from flows.sft.config import SFTConfig
from flows.sft.corpus import Example, builtin_examples, parse_examples, read_examples
from flows.sft.corpus.generate import render
from flows.sft.plan import example_tokens, held_out, load_sft_plan
from whitney.datums import sft_datum
from whitney.renderers import get_renderer
from whitney.tokenizers import BOS_ID, EOS_ID, get_tokenizer


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def pairs(count: int) -> list[dict[str, str]]:
    return [{"prompt": f"Q{i}: ", "completion": f"answer {i}"} for i in range(count)]


def test_the_shipped_corpus_is_the_generators_output() -> None:
    assert corpus.builtin_text() == render()
    examples = builtin_examples()
    assert len(examples) == 312
    assert len({(example.prompt, example.completion) for example in examples}) == 312
    assert examples[0].line == 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "a", \n', "line 2: not valid JSON"),
        ('\n\n["prompt", "completion"]\n', "line 3: expected a JSON object"),
        (
            '{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n',
            "line 2: missing field 'completion'",
        ),
        ('{"completion": "b"}\n', "line 1: missing field 'prompt'"),
        ('{"prompt": 1, "completion": "b"}\n', "line 1: field 'prompt' must be a string"),
        ('{"prompt": "a", "completion": ""}\n', "line 1: field 'completion' is empty"),
        ("\n  \n", "holds no examples"),
    ],
)
def test_jsonl_errors_name_the_file_and_line(text: str, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        read_examples(path)
    assert error.value.field == "data_path"
    assert str(path) in error.value.message
    assert needle in error.value.message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data_path: cannot read .*nowhere\.jsonl"):
        read_examples(tmp_path / "nowhere.jsonl")


def test_extra_fields_and_blank_lines_are_ignored() -> None:
    text = '\n{"prompt": "a", "completion": "b", "id": 7}\n\n{"prompt": "", "completion": "c"}\n'
    assert parse_examples(text, "x") == [Example("a", "b", 2), Example("", "c", 4)]


def test_tokens_are_bos_prompt_then_completion_eos() -> None:
    renderer = get_renderer("auto", get_tokenizer("local/nano"), "local/nano")
    prompt, completion = example_tokens(renderer, Example("Hi", "yo"))
    assert prompt == [BOS_ID, ord("H"), ord("i")]
    assert completion == [ord("y"), ord("o"), EOS_ID]


def test_too_long_an_example_is_refused_naming_its_line(tmp_path: Path) -> None:
    rows = pairs(3) + [{"prompt": "x" * 40, "completion": "y"}]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    config = SFTConfig(data_path=str(path), max_example_tokens=32)
    with pytest.raises(ConfigError, match=r"long\.jsonl line 4: 43 tokens, more than"):
        load_sft_plan(config)


def test_the_eval_split_depends_on_the_text_only() -> None:
    examples = builtin_examples()
    split = held_out(examples, 0.1)
    assert len(split) == 31
    reordered = list(reversed(examples))
    texts = {(examples[i].prompt, examples[i].completion) for i in split}
    again = {(reordered[i].prompt, reordered[i].completion) for i in held_out(reordered, 0.1)}
    assert texts == again
    plans = [load_sft_plan(SFTConfig(seed=seed)) for seed in (0, 1)]
    assert plans[0].data.eval == plans[1].data.eval
    assert len(plans[0].data.train) == 281 and len(plans[0].data.eval) == 31
    assert held_out(examples, 0.0) == set()


def test_an_eval_split_that_leaves_nothing_to_train_is_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "one.jsonl", pairs(1))
    with pytest.raises(ConfigError, match="eval_fraction: .* leaves none to train on"):
        load_sft_plan(SFTConfig(data_path=str(path)))
    plan = load_sft_plan(SFTConfig(data_path=str(path), eval_fraction=0))
    assert len(plan.data.train) == 1 and not plan.data.eval and not plan.eval_due(0)


def test_batches_are_a_pure_function_of_seed_and_step(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "ten.jsonl", pairs(10))
    config = SFTConfig(data_path=str(path), eval_fraction=0, batch_size=4, steps=7)
    plan = load_sft_plan(config)
    assert plan.batches_per_epoch == 3
    ids = [[datum["input"]["token_ids"] for datum in plan.batch(step)] for step in range(7)]
    assert [len(batch) for batch in ids] == [4, 4, 2, 4, 4, 2, 4]
    for epoch in (0, 1):  # each epoch trains on every example once
        seen = [tuple(tokens) for batch in ids[3 * epoch : 3 * epoch + 3] for tokens in batch]
        assert sorted(seen) == sorted(
            tuple(datum["input"]["token_ids"]) for datum in plan.data.train
        )
    assert ids[:3] != ids[3:6]  # reshuffled per epoch
    again = load_sft_plan(config.model_copy(update={"steps": 9}))
    assert [[d["input"]["token_ids"] for d in again.batch(step)] for step in range(7)] == ids
    other_seed = load_sft_plan(config.model_copy(update={"seed": 1}))
    assert [d["input"]["token_ids"] for d in other_seed.batch(0)] != ids[0]


def test_steps_and_epochs_size_the_cycles(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "ten.jsonl", pairs(10))
    by_steps = load_sft_plan(
        SFTConfig(data_path=str(path), eval_fraction=0, batch_size=4, steps=25, steps_per_cycle=10)
    )
    assert (by_steps.total_steps, by_steps.cycles) == (25, 3)
    assert [by_steps.cycle_steps(cycle) for cycle in range(3)] == [
        range(0, 10),
        range(10, 20),
        range(20, 25),
    ]
    by_epochs = load_sft_plan(by_steps.config.model_copy(update={"epochs": 2}))
    assert (by_epochs.total_steps, by_epochs.cycles, by_epochs.steps_per_cycle) == (6, 2, 3)
    assert by_epochs.cycle_steps(1) == range(3, 6)


def test_eval_is_due_before_training_every_k_steps_and_at_the_end() -> None:
    plan = load_sft_plan(SFTConfig(steps=25, eval_every=10))
    assert [done for done in range(26) if plan.eval_due(done)] == [0, 10, 20, 25]


def test_cycles_is_not_an_sft_setting() -> None:
    with pytest.raises(ValueError, match="cycles\n.*not by cycles"):
        SFTConfig(cycles=3)
    assert "cycles" not in SFTConfig.model_json_schema()["properties"]
    assert "cycles" not in SFTConfig().model_dump()


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"messages": []}, "line 1: messages must be a non-empty list"),
        ({"messages": [{"role": "user", "content": "a"}]}, "line 1: messages hold no assistant"),
        ({"messages": [{"role": "bot", "content": "a"}]}, "line 1: messages[0].role must be"),
        ({"messages": [{"role": "user", "content": 3}]}, "line 1: messages[0].content must be"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]},
            "line 1: messages[1].content is empty",
        ),
    ],
)
def test_conversation_errors_name_the_line_and_message(row: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_examples(json.dumps(row), "chats.jsonl")
    assert error.value.field == "data_path"
    assert needle in error.value.message


def test_pairs_train_on_the_datums_they_always_did(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "ten.jsonl", pairs(10))
    plan = load_sft_plan(SFTConfig(data_path=str(path), eval_fraction=0))
    expected = [
        sft_datum([BOS_ID, *f"Q{i}: ".encode()], [*f"answer {i}".encode(), EOS_ID])
        for i in range(10)
    ]
    assert list(plan.data.train) == expected


def test_a_conversation_trains_on_its_assistant_turns(tmp_path: Path) -> None:
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": chat}, *pairs(1)])
    plan = load_sft_plan(SFTConfig(data_path=str(path), eval_fraction=0))
    (example, _) = read_examples(path)
    assert example.prompt == chat[:4] and example.completion == "A2"
    tokens = [BOS_ID, *b"SQ1A1", EOS_ID, *b"Q2A2", EOS_ID]  # raw: the text, EOS after each answer
    learned = [0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1]
    datum = plan.data.train[0]
    assert datum["input"]["token_ids"] == tokens[:-1]
    assert datum["loss_inputs"]["target_tokens"]["values"] == tokens[1:]
    assert datum["loss_inputs"]["weights"]["values"] == learned[1:]
