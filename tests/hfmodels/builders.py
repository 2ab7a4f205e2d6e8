"""Tiny Hugging Face models built offline, in seconds, for the tests of `hf` base models:
byte-level BPE tokenizers trained here on a few sentences, with the special tokens and chat
templates of the Llama 3 and Qwen families; random Llama (Llama 3 RoPE scaling, grouped-query
attention, tied embeddings) and Qwen2 (q/k/v biases, tied embeddings) checkpoints; and a Hugging
Face cache laid out as huggingface_hub writes one (`models--owner--name/refs/main`,
`snapshots/<revision>/`), so that "a repo id in the local cache" is tested for real."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LLAMA_REPO = "whitney-test/tiny-llama3"
QWEN_REPO = "whitney-test/tiny-qwen2"
GPT2_REPO = "whitney-test/tiny-gpt2"
"""A cached checkpoint of an architecture the engine does not serve (config and tokenizer)."""
REVISION = "0123456789abcdef0123456789abcdef01234567"

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
"""Meta-Llama-3-8B-Instruct's chat template, verbatim."""
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + "
    "'\n</tool_response><|im_end|>\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
"""Qwen2.5's ChatML template for system, user, assistant and (single) tool messages, without
its default system message and its tool calls."""
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CORPUS = (
    "The cat sat on the mat. The dog ran to the park.",
    "What colour is the sky? The sky is blue.",
    "What does the cat eat? The cat eats fish.",
    "Hello! How are you today? I am well, thank you.",
    "system user assistant ipython tool",
    "Count to five: one two three four five.",
    "Be brief. Answer in one word.",
    "12345 67890",
)


def train_tokenizer(pattern: str, specials: tuple[str, ...], vocab_size: int = 360) -> Any:
    """A byte-level BPE (a regex pre-tokenizer as the family's, then bytes), specials first."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(CORPUS) * 4, trainer)
    return backend


def fast_tokenizer(pattern: str, specials: tuple[str, ...], template: str, **tokens: Any) -> Any:
    """A transformers tokenizer over `train_tokenizer(pattern, specials)`, with this chat
    template and these special tokens (`bos_token=...`)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(pattern, specials), **tokens
    )
    tokenizer.chat_template = template
    return tokenizer


@functools.cache
def llama3_tokenizer() -> Any:
    """Llama 3 Instruct's special tokens and template: BOS <|begin_of_text|>, EOS <|eot_id|>."""
    return fast_tokenizer(
        LLAMA3_PATTERN,
        LLAMA3_SPECIALS,
        LLAMA3_TEMPLATE,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        additional_special_tokens=list(LLAMA3_SPECIALS[1:4]),
    )


@functools.cache
def qwen_tokenizer() -> Any:
    """Qwen2 Instruct's special tokens and (ChatML) template: no BOS, EOS <|im_end|>."""
    tokenizer = fast_tokenizer(
        QWEN_PATTERN,
        QWEN_SPECIALS,
        CHATML_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.add_tokens(["<tool_response>", "</tool_response>"])  # Qwen2.5's, not special
    return tokenizer


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Random norms and biases too (transformers initialises them to 1 and 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))


TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
"""The tiny Llama's and Qwen2's shared shape: 2 layers, 4 query heads on 2 key/value heads,
tied embeddings."""


def save_random(directory: Path, model_class: Any, config: Any, tokenizer: Any, seed: int) -> None:
    """A `model_class` of `config` with random weights (`seed`, `perturb`), and `tokenizer`,
    saved to `directory`."""
    torch.manual_seed(seed)
    model = model_class(config)
    perturb(model, seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def save_llama(directory: Path) -> None:
    """A random 2-layer Llama: Llama 3 RoPE scaling, 4 query heads on 2 key/value heads,
    tied embeddings, with the Llama 3 tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = llama3_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        **TINY_SHAPE,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|end_of_text|>"), tokenizer.eos_token_id],
    )
    save_random(directory, LlamaForCausalLM, config, tokenizer, seed=1)


def save_qwen2(directory: Path) -> None:
    """A random 2-layer Qwen2: random q/k/v biases, 4 query heads on 2 key/value heads, tied
    embeddings, with the Qwen tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = qwen_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **TINY_SHAPE,
        rope_theta=1000000.0,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
    )
    save_random(directory, Qwen2ForCausalLM, config, tokenizer, seed=2)


def save_gpt2_config(directory: Path) -> None:
    """Only what a cached repo of another architecture needs here: config and tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    qwen_tokenizer().save_pretrained(directory)


def add_to_cache(cache: Path, repo_id: str, save: Callable[[Path], None]) -> Path:
    """`save` a model into the cache as `repo_id`'s main revision; its snapshot directory."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    save(snapshot)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REVISION)
    return snapshot


def build_cache(cache: Path) -> Path:
    """A Hugging Face cache holding the tiny Llama, the tiny Qwen2 and a GPT-2 config."""
    add_to_cache(cache, LLAMA_REPO, save_llama)
    add_to_cache(cache, QWEN_REPO, save_qwen2)
    add_to_cache(cache, GPT2_REPO, save_gpt2_config)
    return cache


def llama3_by_hand(
    tokenizer: Any, messages: list[dict[str, str]], generation: bool = False
) -> tuple[list[int], list[float]]:
    """Llama 3's format and its assistant mask, special token by special token (contents
    without surrounding white space: the template trims them)."""
    special, text = tokenizer.convert_tokens_to_ids, _text(tokenizer)

    def header(role: str) -> list[int]:
        start, end = special("<|start_header_id|>"), special("<|end_header_id|>")
        return [start, *text(role), end, *text("\n\n")]

    tokens, weights = [special("<|begin_of_text|>")], [0.0]
    for message in messages:
        head = header(message["role"])
        body = text(message["content"]) + [special("<|eot_id|>")]
        learned = float(message["role"] == "assistant")
        tokens += head + body
        weights += [0.0] * len(head) + [learned] * len(body)
    if generation:
        tokens += header("assistant")
        weights += [0.0] * (len(tokens) - len(weights))
    return tokens, weights


def chatml_by_hand(
    tokenizer: Any, messages: list[dict[str, str]], generation: bool = False
) -> tuple[list[int], list[float]]:
    """Qwen's ChatML format and its assistant mask, special token by special token."""
    special, text = tokenizer.convert_tokens_to_ids, _text(tokenizer)
    tokens: list[int] = []
    weights: list[float] = []
    for message in messages:
        head = [special("<|im_start|>"), *text(message["role"] + "\n")]
        body = text(message["content"]) + [special("<|im_end|>")]
        learned = float(message["role"] == "assistant")
        tokens += head + body + text("\n")
        weights += [0.0] * len(head) + [learned] * len(body) + [0.0]
    if generation:
        tokens += [special("<|im_start|>"), *text("assistant\n")]
        weights += [0.0] * (len(tokens) - len(weights))
    return tokens, weights


def _text(tokenizer: Any) -> Callable[[str], list[int]]:
    return lambda value: tokenizer.encode(value, add_special_tokens=False)
