"""The exported directories compute what the server computes: Hugging Face's own forward of
the merged model and of the PEFT adapter on its base model, against the server's `forward`
over HTTP (log-probabilities of every vocabulary token at every position, within 1e-5), and
greedy generation against the server's `sample` with top_k 1, token for token."""

from __future__ import annotations

import random

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from whitney.tokenizers import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

from .helpers import BYTES, PAIRS, hf_log_probs, prompt_tokens, server_greedy, server_log_probs

TOLERANCE = 1e-5
SEQUENCES = [
    prompt_tokens("Number: 42"),
    prompt_tokens("Ünïcödé, 日本語 and <s> as text"),
    [BOS_ID, *random.Random(0).choices(range(256), k=80), EOS_ID],
]


@pytest.fixture(scope="module")
def merged(exported):
    return AutoModelForCausalLM.from_pretrained(exported.merged_dir).eval()


@pytest.mark.parametrize("tokens", SEQUENCES, ids=["prompt", "unicode", "random-bytes"])
def test_merged_log_probs_are_the_servers_forward(exported, client, merged, tokens):
    ours = hf_log_probs(merged, tokens)
    server = server_log_probs(client, exported.run_id, tokens)
    assert ours.shape == server.shape == (len(tokens), VOCAB_SIZE)
    assert (ours - server).abs().max().item() <= TOLERANCE


def test_the_adapter_moved_the_model(exported, client, merged):
    """Not a vacuous comparison: the trained adapter changed the base model's numbers."""
    base = AutoModelForCausalLM.from_pretrained(exported.peft_dir / "base_model").eval()
    tokens = SEQUENCES[0]
    assert (hf_log_probs(base, tokens) - hf_log_probs(merged, tokens)).abs().max() > 0.1


@pytest.mark.filterwarnings("ignore::FutureWarning")  # PEFT calls a deprecated API
def test_peft_dir_loads_from_another_directory(exported, client, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = AutoPeftModelForCausalLM.from_pretrained(exported.peft_dir).eval()
    for tokens in SEQUENCES:
        server = server_log_probs(client, exported.run_id, tokens)
        assert (hf_log_probs(model, tokens) - server).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("prompt", [p for p, _ in PAIRS] + ["Hello, ", "é"])
def test_greedy_generation_is_the_servers_top_k_1_sample(exported, client, merged, prompt):
    tokens = prompt_tokens(prompt)
    expected = server_greedy(client, exported.run_id, exported.sampler_id, tokens, 32)
    output = merged.generate(torch.tensor([tokens]), max_new_tokens=32, do_sample=False)
    assert output[0, len(tokens) :].tolist() == expected


@pytest.mark.parametrize("where", ["merged_dir", "peft_dir"])
def test_tokenizer_encodes_as_the_byte_tokenizer(exported, where):
    tokenizer = AutoTokenizer.from_pretrained(getattr(exported, where))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (BOS_ID, EOS_ID)
    assert tokenizer.pad_token_id == PAD_ID
    assert len(tokenizer) == VOCAB_SIZE
    for text in [
        "",
        "Number: ",
        "  two  spaces\n\ttab",
        "Ünïcödé 日本語 🙂",
        "<s></s><pad>",
        "\x00\x7f",
    ]:
        ids = BYTES.encode(text)
        assert tokenizer(text)["input_ids"] == [BOS_ID, *ids]
        assert tokenizer.encode(text, add_special_tokens=False) == ids
        assert tokenizer.decode([BOS_ID, *ids, EOS_ID], skip_special_tokens=True) == text
    broken = [0xC3, EOS_ID, ord("a"), 0xFF]
    assert tokenizer.decode(broken, skip_special_tokens=True) == BYTES.decode(broken)
