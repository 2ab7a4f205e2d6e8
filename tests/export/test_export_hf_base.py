"""An `hf:<local dir>` base model: the export carries that model's own tokenizer (from the
directory, offline), and the PEFT directory computes what the server's forward computes."""

from __future__ import annotations

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from whitney.client import WhitneyClient

from .helpers import export, hf_log_probs, server_log_probs


@pytest.fixture
def hf_base(tmp_path):
    """A small random Llama with a word-level tokenizer of its own, saved as a local model."""
    words = {"[UNK]": 0, "<bos>": 1, "<eos>": 2, "hello": 3, "world": 4}
    backend = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="[UNK]"
    )
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    return tmp_path / "base"


@pytest.mark.filterwarnings("ignore::FutureWarning")  # PEFT calls a deprecated API
def test_an_hf_base_model_keeps_its_tokenizer(
    embedded_server, client: WhitneyClient, hf_base, tmp_path
):
    session = client.open_session({"test": "export-hf"})
    run_id = client.create_run(session.session_id, "local", f"hf:{hf_base}", seed=1).run_id
    where = {"url": embedded_server.url, "key": embedded_server.api_key}
    assert export(run_id, tmp_path / "out", **where) == 0
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer("hello world")["input_ids"] == [3, 4]
    model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    tokens = [1, 3, 4, 3, 2]
    server = server_log_probs(client, run_id, tokens, vocab=64)
    assert (hf_log_probs(model, tokens) - server).abs().max().item() <= 1e-5
