"""The flows on Hugging Face checkpoints served by repo id from the local cache (tiny random
Llama 3 and Qwen2 models, built offline): SFT on chat data with the model's chat template, an
RL flow whose environment gives messages (its inline evaluation's rendered the same way), the
CLI end to end on the embedded server it starts, and the refusals before any session opens (a
base model the provider does not list, a teacher whose renderer differs from the student's)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from flowtest_hf import ASK, SYSTEM, conversations
from flowtest_settings import QUICK_RECOVERY

from flows.cli.main import main
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.sft.config import SFTConfig
from flows.sft.flow import sft_flow
from tests.hfmodels.builders import (
    GPT2_REPO,
    LLAMA_REPO,
    QWEN_REPO,
    chatml_by_hand,
    llama3_by_hand,
    llama3_tokenizer,
    qwen_tokenizer,
)
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


@pytest.fixture
def hf_server(hf_models: Path, monkeypatch: pytest.MonkeyPatch):
    """An embedded server of the tiny checkpoints' cache, its key where flows look for it."""
    with EmbeddedWhitney(hf_cache=hf_models, session_ttl_s=0) as server:
        monkeypatch.setenv("WHITNEY_API_KEY", server.api_key)
        monkeypatch.delenv("WHITNEY_API_URL", raising=False)
        yield server


@pytest.fixture
def chat_data(tmp_path: Path) -> Path:
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in conversations()))
    return path


def sent(server: EmbeddedWhitney, run_id: str, kind: str) -> list[dict]:
    """The payloads of the run's `kind` operations, as the server journaled them."""
    assert server.data_dir is not None
    with sqlite3.connect(f"file:{server.data_dir / 'journal.sqlite3'}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT payload FROM operations WHERE run_id=? AND kind=? ORDER BY seq_id",
            (run_id, kind),
        ).fetchall()
    return [json.loads(payload) for (payload,) in rows]


FORMATS = {
    QWEN_REPO: (qwen_tokenizer, chatml_by_hand, "<|im_end|>"),
    LLAMA_REPO: (llama3_tokenizer, llama3_by_hand, "<|eot_id|>"),
}
"""Each checkpoint's tokenizer, its chat format written by hand, its end-of-turn token."""


@pytest.mark.parametrize("repo_id", [QWEN_REPO, LLAMA_REPO])
def test_sft_on_chat_data_with_the_chat_template(
    hf_server: EmbeddedWhitney, chat_data: Path, repo_id: str
):
    config = SFTConfig(
        api_url=hf_server.url,
        base_model=repo_id,
        data_path=str(chat_data),
        steps=10,
        steps_per_cycle=5,
        batch_size=4,
        learning_rate=2e-2,
        warmup_steps=0,
        eval_fraction=0.25,
        eval_every=10,
        **QUICK_RECOVERY,
    )
    result = sft_flow(config)
    assert result.eval_losses[-1] < result.eval_losses[0], result.eval_losses
    tokenizer, by_hand, _ = FORMATS[repo_id]
    expected = {}
    for chat in conversations():
        tokens, weights = by_hand(tokenizer(), chat)
        expected[tuple(tokens[:-1])] = weights[1:]
    trained = [
        datum
        for payload in sent(hf_server, result.run_id, "forward_backward")
        for datum in payload["data"]
    ]
    assert len(trained) == 10 * 4
    for datum in trained:  # every datum is a chat in the format, trained on assistant turns
        tokens = tuple(datum["input"]["token_ids"])
        assert datum["loss_inputs"]["weights"]["values"] == expected[tokens]


@pytest.mark.parametrize(("repo_id", "renderer"), [(LLAMA_REPO, "llama3"), (QWEN_REPO, "auto")])
def test_rl_with_messages_as_prompts(hf_server: EmbeddedWhitney, repo_id: str, renderer: str):
    config = RLConfig(
        api_url=hf_server.url,
        base_model=repo_id,
        renderer=renderer,
        env="flowtest_hf:ChatNumbers",
        cycles=2,
        prompts_per_cycle=2,
        group_size=2,
        max_tokens=6,
        eval_every=2,
        **QUICK_RECOVERY,
    )
    result = rl_flow(config)
    assert len(result.cycles) == 2
    evaluation = result.cycles[1].eval  # 8 held-out prompts (drawn for cycle -1), k = 2
    assert evaluation is not None and (evaluation.prompts, evaluation.k) == (8, 2)
    make_tokenizer, by_hand, end_of_turn = FORMATS[repo_id]
    tokenizer = make_tokenizer()
    prompt, _ = by_hand(tokenizer, [SYSTEM, *ASK], generation=True)
    samples = sent(hf_server, result.run_id, "sample")
    assert len(samples) == 4 + 2 * 8  # training's, then the evaluation's greedy and sampled
    assert [p["sampling_params"]["top_k"] for p in samples[4:12]] == [1] * 8
    for payload in samples:  # the evaluation renders its prompts as training does
        assert payload["prompt"]["token_ids"] == prompt
        stop = payload["sampling_params"]["stop_token_ids"]
        assert stop == [tokenizer.convert_tokens_to_ids(end_of_turn)]


def test_the_cli_trains_a_cached_repo_id_on_the_embedded_server_it_starts(
    hf_models: Path, chat_data: Path, tmp_path: Path, monkeypatch, capsys
):
    """`whitney-flows run sft --base-model owner/name --data chats.jsonl`, no Whitney URL."""
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    monkeypatch.setenv("WHITNEY_API_KEY", "replaced by the embedded server's")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "200")
    arguments = ["--base-model", QWEN_REPO, "--data", str(chat_data), "--steps", "4"]
    code = main(["run", "sft", *arguments, "--adapter-dir", str(tmp_path / "adapters")])
    output = capsys.readouterr()
    assert code == 0, output.err
    assert "SFT flow finished" in output.out
    adapter, picture, manifest = sorted(path.name for path in (tmp_path / "adapters").iterdir())
    assert adapter.endswith("-adapter.tar") and picture.endswith("-learning-curves.png")
    assert manifest.endswith("-manifest.json")


def test_a_base_model_the_provider_does_not_list_is_refused_with_the_list(
    hf_server: EmbeddedWhitney, capsys
):
    """Its tokenizer is in the cache, but the architecture is not served: exit 2 naming
    base_model and what the provider serves, and no session."""
    with WhitneyClient(hf_server.url, hf_server.api_key) as client:
        before = len(client.list_sessions())
        code = main(["run", "sft", "--api-url", hf_server.url, "--base-model", GPT2_REPO])
        error = capsys.readouterr().err
        assert code == 2
        assert error.startswith("whitney-flows run sft: base_model: 'whitney-test/tiny-gpt2'")
        assert f"local/nano, local/tiny, local/small, {LLAMA_REPO}, {QWEN_REPO}" in error
        assert len(client.list_sessions()) == before


def test_a_flow_run_refuses_it_before_opening_a_session(hf_server: EmbeddedWhitney):
    """A deployment's run (the UI form takes any name): the flow fails before a session."""
    config = RLConfig(api_url=hf_server.url, base_model=GPT2_REPO, cycles=1, **QUICK_RECOVERY)
    state = rl_flow(config, return_state=True)
    assert state.is_failed()
    assert "base_model: 'whitney-test/tiny-gpt2' is not a base model" in state.message
    with WhitneyClient(hf_server.url, hf_server.api_key) as client:
        assert client.list_sessions() == []


def test_distillation_refuses_a_teacher_rendering_otherwise(
    hf_server: EmbeddedWhitney, tmp_path: Path, capsys
):
    config = tmp_path / "distill.toml"
    config.write_text('renderer = "qwen"\nteacher_renderer = "chat_template"\n')
    arguments = ["--api-url", hf_server.url, "--base-model", QWEN_REPO, "--teacher", "base"]
    code = main(["run", "distill", *arguments, "--config", str(config)])
    error = capsys.readouterr().err
    assert code == 2
    assert error.startswith("whitney-flows run distill: teacher_renderer: the teacher's renderer")
    assert "renderer=qwen" in error and "teacher_renderer=chat_template" in error
