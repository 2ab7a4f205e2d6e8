"""Renderers against hand-written token sequences: the Llama 3 and Qwen formats' tokens and
masks written out here special token by special token, the models' own chat templates giving
the same tokens and masks, raw rendering giving the flows' (prompt, completion) datums, and a
multi-turn transcript rendered turn by turn giving the whole conversation's tokens."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from tests.hfmodels.builders import (
    chatml_by_hand,
    llama3_by_hand,
    llama3_tokenizer,
    qwen_tokenizer,
)
from whitney.datums import rl_datum, sft_datum
from whitney.renderers import (
    RENDERERS,
    ChatTemplateRenderer,
    Llama3Renderer,
    Message,
    QwenRenderer,
    RawRenderer,
    RendererName,
    Transcript,
    as_messages,
    check_messages,
    get_renderer,
)
from whitney.tokenizers import BOS_ID, EOS_ID, ByteTokenizer, HFTokenizer

CONVERSATION: list[Message] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What does the cat eat?"},
    {"role": "assistant", "content": "Fish."},
    {"role": "user", "content": "And the dog?"},
    {"role": "assistant", "content": "The dog eats meat."},
]


def wrap(tokenizer: Any) -> HFTokenizer:
    return HFTokenizer(tokenizer, "test")


def pieces(tokenizer: Any):
    """The hand-writing kit: a special token's id, and a text's ids."""

    def special(token: str) -> list[int]:
        return [tokenizer.convert_tokens_to_ids(token)]

    def text(value: str) -> list[int]:
        return tokenizer.encode(value, add_special_tokens=False)

    return special, text


@pytest.mark.parametrize(
    ("make_tokenizer", "renderer", "by_hand", "end"),
    [
        (llama3_tokenizer, Llama3Renderer, llama3_by_hand, "<|eot_id|>"),
        (qwen_tokenizer, QwenRenderer, chatml_by_hand, "<|im_end|>"),
    ],
    ids=["llama3", "qwen"],
)
def test_the_renderer_renders_the_hand_written_tokens_and_mask(
    make_tokenizer, renderer, by_hand, end
):
    tokenizer = make_tokenizer()
    rendered = renderer(wrap(tokenizer)).build_supervised(CONVERSATION)
    assert (rendered.tokens, rendered.weights) == by_hand(tokenizer, CONVERSATION)
    learned = [t for t, w in zip(rendered.tokens, rendered.weights, strict=True) if w]
    assert tokenizer.decode(learned) == f"Fish.{end}The dog eats meat.{end}"


@pytest.mark.parametrize(
    ("tokenizer", "explicit", "stop"),
    [
        (llama3_tokenizer, Llama3Renderer, "<|eot_id|>"),
        (qwen_tokenizer, QwenRenderer, "<|im_end|>"),
    ],
)
def test_the_models_own_template_gives_the_same_tokens_and_masks(tokenizer, explicit, stop):
    """Meta's Llama 3 template and Qwen2.5's ChatML template, through apply_chat_template."""
    hf = wrap(tokenizer())
    template = ChatTemplateRenderer(hf)
    mine = explicit(hf)
    assert template.stop_tokens == (hf.token_id(stop),) == mine.stop_tokens
    assert template.build_supervised(CONVERSATION) == mine.build_supervised(CONVERSATION)
    for end in range(1, len(CONVERSATION) + 1):
        if CONVERSATION[end - 1]["role"] != "assistant":
            prompt = template.build_generation_prompt(CONVERSATION[:end])
            assert prompt == mine.build_generation_prompt(CONVERSATION[:end])
    assert template.signature != mine.signature


def test_tool_messages():
    """Qwen: a user turn holding the tool response (Qwen2.5's template, markers as their own
    tokens); Llama 3: the ipython role."""
    tool: list[Message] = [
        {"role": "user", "content": "Count the cats."},
        {"role": "assistant", "content": "count()"},
        {"role": "tool", "content": "3"},
    ]
    qwen = qwen_tokenizer()
    special, text = pieces(qwen)
    rendered = QwenRenderer(wrap(qwen)).build_supervised(tool)
    last = special("<|im_start|>") + text("user\n") + special("<tool_response>")
    last += text("\n3\n") + special("</tool_response>") + special("<|im_end|>") + text("\n")
    assert rendered.tokens[-len(last) :] == last
    assert not any(rendered.weights[-len(last) :])
    assert rendered == ChatTemplateRenderer(wrap(qwen)).build_supervised(tool)
    llama = llama3_tokenizer()
    special, text = pieces(llama)
    rendered = Llama3Renderer(wrap(llama)).build_supervised(tool)
    last = special("<|start_header_id|>") + text("ipython") + special("<|end_header_id|>")
    last += text("\n\n") + text("3") + special("<|eot_id|>")
    assert rendered.tokens[-len(last) :] == last


def test_raw_renders_a_pair_as_the_flows_always_did():
    raw = RawRenderer(ByteTokenizer())
    pair: list[Message] = [
        {"role": "user", "content": "Q: hi"},
        {"role": "assistant", "content": "yo"},
    ]
    rendered = raw.build_supervised(pair)
    assert rendered.tokens == [BOS_ID, *b"Q: hi", *b"yo", EOS_ID]
    assert rendered.datum() == sft_datum([BOS_ID, *b"Q: hi"], [*b"yo", EOS_ID])
    assert rendered.last_turn() == ([BOS_ID, *b"Q: hi"], [*b"yo", EOS_ID])
    assert raw.build_generation_prompt(pair[:1]) == [BOS_ID, *b"Q: hi"]
    assert raw.stop_tokens == (EOS_ID,)
    assert raw.parse_response([*b"42", EOS_ID, *b"x"]) == {"role": "assistant", "content": "42"}


def test_auto_and_refusals():
    assert get_args(RendererName) == ("auto", *RENDERERS)  # the config's dropdown: every one
    llama = wrap(llama3_tokenizer())
    assert get_renderer("auto", ByteTokenizer(), "local/nano").name == "raw"
    assert get_renderer("auto", llama, "org/model").name == "chat_template"
    with pytest.raises(ValueError, match="<|begin_of_text|>"):
        get_renderer("llama3", ByteTokenizer(), "local/nano")
    with pytest.raises(ValueError, match="has no chat template"):
        get_renderer("chat_template", ByteTokenizer(), "local/nano")
    with pytest.raises(ValueError, match="unknown renderer 'chatml'"):
        get_renderer("chatml", llama, "org/model")
    with pytest.raises(ValueError, match=r"messages\[1\].role must be one of"):
        check_messages([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}])
    with pytest.raises(ValueError, match=r"prompt\[0\].content must be a string"):
        as_messages([{"role": "user", "content": None}])  # an environment's prompt, checked
    assert as_messages("hi") == [{"role": "user", "content": "hi"}]


def test_a_template_that_rewrites_earlier_turns_is_refused():
    """Like Qwen3's, which drops the reasoning of earlier assistant turns."""
    tokenizer = qwen_tokenizer()
    hf = wrap(tokenizer)
    hf.chat_template = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['role'] != 'assistant' or loop.last %}{{ message['content'] }}{% endif %}"
        "{{ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    renderer = ChatTemplateRenderer(hf)
    with pytest.raises(ValueError, match="before message 3 differently"):
        renderer.build_supervised(CONVERSATION)


def body(renderer, content: str) -> list[int]:
    """What a model that answers `content` samples: the turn's learned tokens."""
    turn = [{"role": "user", "content": "x"}, {"role": "assistant", "content": content}]
    return renderer.build_supervised(turn).last_turn()[1]


@pytest.mark.parametrize(
    "make",
    [
        lambda: RawRenderer(ByteTokenizer()),
        lambda: Llama3Renderer(wrap(llama3_tokenizer())),
        lambda: QwenRenderer(wrap(qwen_tokenizer())),
        lambda: ChatTemplateRenderer(wrap(qwen_tokenizer())),
    ],
)
def test_a_transcript_rendered_turn_by_turn_is_the_whole_conversation(make):
    renderer = make()
    transcript = Transcript(renderer, CONVERSATION[:2])
    assert transcript.tokens == renderer.build_generation_prompt(CONVERSATION[:2])
    first = body(renderer, "Fish.")
    reply = transcript.add_completion(first, [-0.5] * len(first))
    assert reply == {"role": "assistant", "content": "Fish."}
    prompt = transcript.add_messages(CONVERSATION[3:4])
    assert prompt == renderer.build_generation_prompt(CONVERSATION[:4])
    second = body(renderer, "The dog eats meat.")
    transcript.add_completion(second, [-0.25] * len(second))
    whole = renderer.build_supervised(CONVERSATION)
    assert transcript.tokens == whole.tokens[: len(transcript.tokens)]
    assert transcript.mask == whole.weights[: len(transcript.tokens)]
    assert transcript.messages == CONVERSATION


def test_a_cut_completion_is_closed_before_the_next_turn():
    renderer = QwenRenderer(wrap(qwen_tokenizer()))
    transcript = Transcript(renderer, CONVERSATION[:2])
    cut = body(renderer, "Fish.")[:-1]  # max_tokens reached before <|im_end|>
    transcript.add_completion(cut, [-1.0] * len(cut))
    transcript.add_messages(CONVERSATION[3:4])
    assert transcript.tokens == renderer.build_generation_prompt(CONVERSATION[:4])
    learned = [t for t, w in zip(transcript.tokens, transcript.mask, strict=True) if w]
    assert learned == cut  # the closing <|im_end|> is the renderer's, not the model's


def test_a_one_turn_transcript_datum_is_rl_datum():
    renderer = RawRenderer(ByteTokenizer())
    transcript = Transcript(renderer, [{"role": "user", "content": "n="}])
    transcript.add_completion([*b"42", EOS_ID], [-0.1, -0.2, -0.3])
    expected = rl_datum([BOS_ID, *b"n="], [*b"42", EOS_ID], [-0.1, -0.2, -0.3], 0.5)
    assert transcript.datum(0.5) == expected
