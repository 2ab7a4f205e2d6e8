"""An `hf:<local dir>` base model: the export carries that model's own tokenizer (from the
directory, offline), and the PEFT directory computes what the server's forward computes."""

from __future__ import annotations

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from whitney.errors import UnsupportedBaseModel
from whitney.local import EmbeddedWhitney

from .helpers import export, hf_log_probs, new_client, server_log_probs


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
def test_an_hf_base_model_keeps_its_tokenizer(hf_base, tmp_path):
    with (
        EmbeddedWhitney(hf_dirs=(hf_base.parent,)) as server,
        new_client(server) as client,
    ):
        session = client.open_session({"test": "export-hf"})
        run_id = client.create_run(session.session_id, "local", f"hf:{hf_base}", seed=1).run_id
        assert export(run_id, tmp_path / "out", url=server.url, key=server.api_key) == 0
        tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
        assert tokenizer("hello world")["input_ids"] == [3, 4]
        model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "out").eval()
        tokens = [1, 3, 4, 3, 2]
        server_logprobs = server_log_probs(client, run_id, tokens, vocab=64)
    assert (hf_log_probs(model, tokens) - server_logprobs).abs().max().item() <= 1e-5


def test_an_hf_directory_the_server_does_not_allow_gets_one_answer(
    embedded_server: EmbeddedWhitney, hf_base, tmp_path
):
    """A directory outside `--hf-dir` is refused exactly as one that does not exist, before
    the disk is looked at: no tenant can probe the server's files."""
    with new_client(embedded_server) as client:
        session = client.open_session({"test": "export-hf-refused"}).session_id
        answers = []
        for name in (f"hf:{hf_base}", f"hf:{tmp_path / 'missing'}", "hf:/etc", "hf:../x"):
            with pytest.raises(UnsupportedBaseModel) as refused:
                client.create_run(session, "local", name)
            answers.append(refused.value.message.replace(name, "NAME"))
        assert len(set(answers)) == 1, answers
        assert "--hf-dir" in answers[0]
