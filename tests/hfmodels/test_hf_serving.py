"""Hugging Face checkpoints on the embedded server, over HTTP: the capabilities list the
Llama and Qwen2 checkpoints of the server's cache by repo id; a plain repo id trains, samples
and exports; the exported adapter, loaded by PEFT on the same checkpoint, computes the server's
logprobs within 1e-5 (random q/k/v biases, Llama 3 RoPE scaling, grouped-query attention and
tied embeddings included); and every name the server does not serve gets one answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer

from tests.export.helpers import export, hf_log_probs, new_client, server_log_probs
from tests.hfmodels.builders import GPT2_REPO, LLAMA_REPO, QWEN_REPO
from whitney.errors import UnsupportedBaseModel
from whitney.local import EmbeddedWhitney
from whitney.renderers import get_renderer
from whitney.tokenizers import get_tokenizer

CHATS = [
    [
        {"role": "user", "content": "What does the cat eat?"},
        {"role": "assistant", "content": "Fish."},
    ],
    [
        {"role": "user", "content": "Count to five."},
        {"role": "assistant", "content": "one two three"},
    ],
]


@pytest.fixture
def server(hf_models: Path):
    with EmbeddedWhitney(hf_cache=hf_models) as running:
        yield running


def test_the_capabilities_list_the_served_checkpoints_of_the_cache(server: EmbeddedWhitney):
    with new_client(server) as client:
        capabilities = client.capabilities()
    for provider in capabilities.providers.values():
        assert provider.base_models == [
            "local/nano",
            "local/tiny",
            "local/small",
            LLAMA_REPO,
            QWEN_REPO,
        ]  # not the GPT-2 checkpoint: an architecture the engine does not serve


def test_a_name_the_server_does_not_serve_gets_one_answer(server: EmbeddedWhitney, tmp_path):
    names = [GPT2_REPO, "whitney-test/missing", "../x", "/etc", "a/b/c", "org/..", "Qwen/Qwen3-4B"]
    with new_client(server) as client:
        session = client.open_session({"test": "hf-refused"}).session_id
        answers = set()
        for name in names:
            with pytest.raises(UnsupportedBaseModel) as refused:
                client.create_run(session, "local", name)
            answers.add(refused.value.message.replace(repr(name), "NAME"))
            assert refused.value.details == {"field": "base_model"}
        assert client.get_session(session).run_ids == []
    assert len(answers) == 1, answers
    assert "GET /v1/training/capabilities" in answers.pop()


def chat_payload(repo_id: str) -> dict:
    renderer = get_renderer("chat_template", get_tokenizer(repo_id), repo_id)
    data = [renderer.build_supervised(messages).datum() for messages in CHATS]
    return {"data": data, "loss_function": "cross_entropy", "loss_config": {}}


@pytest.mark.filterwarnings("ignore::FutureWarning")  # PEFT calls a deprecated API
@pytest.mark.parametrize("repo_id", [LLAMA_REPO, QWEN_REPO])
def test_the_exported_adapter_computes_the_servers_logprobs(
    server: EmbeddedWhitney, repo_id: str, tmp_path: Path
):
    payload = chat_payload(repo_id)
    tokens = payload["data"][0]["input"]["token_ids"]
    with new_client(server) as client:
        session = client.open_session({"test": "hf-export"}).session_id
        run_id = client.create_run(session, "local", repo_id, lora_rank=4, seed=3).run_id
        losses = []
        for _ in range(4):
            losses.append(client.run_operation(run_id, "forward_backward", payload)["loss"])
            client.run_operation(
                run_id, "optim_step", {"optimizer": {"type": "adamw", "learning_rate": 2e-2}}
            )
        assert losses[-1] < losses[0]  # the adapter moved
        sampler = client.run_operation(run_id, "save_weights_for_sampler", {})["sampler_id"]
        sampled = client.sampler_operation(
            run_id,
            sampler,
            "sample",
            {"prompt": {"token_ids": tokens[:6]}, "sampling_params": {"max_tokens": 8, "seed": 1}},
        )["sequences"][0]
        scored = client.sampler_operation(
            run_id,
            sampler,
            "logprobs",
            {"sequences": [{"token_ids": tokens[:6] + sampled["tokens"]}]},
        )["logprobs"][0]
        assert scored[6:] == sampled["logprobs"]  # sampling and scoring: one decoder, bit for bit
        vocab = get_tokenizer(repo_id).vocab_size
        expected = server_log_probs(client, run_id, tokens, vocab=vocab)
    assert export(run_id, tmp_path / "out", url=server.url, key=server.api_key) == 0
    model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert (hf_log_probs(model, tokens) - expected).abs().max().item() <= 1e-5
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.chat_template == get_tokenizer(repo_id).chat_template
    assert torch.isfinite(expected).all()
