"""One place resolves a base model's tokenizer: bytes for `local/*`, the Hugging Face tokenizer
of any repo id from the local cache (laid out as huggingface_hub writes it), a directory, or the
`tokenizer` override; offline, a missing one is a clear error naming the model and how to
provide it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hfmodels.builders import GPT2_REPO, LLAMA_REPO, QWEN_REPO
from whitney import hf_cache
from whitney.tokenizers import ByteTokenizer, HFTokenizer, get_tokenizer


def test_the_cache_is_found_as_huggingface_hub_lays_it_out(hf_models: Path, monkeypatch):
    assert hf_cache.cache_dir() == hf_models
    assert hf_cache.cached_repo_ids() == [GPT2_REPO, LLAMA_REPO, QWEN_REPO]
    assert hf_cache.snapshot(LLAMA_REPO) == next(
        (hf_models / "models--whitney-test--tiny-llama3" / "snapshots").iterdir()
    )
    assert hf_cache.snapshot("whitney-test/missing") is None
    assert hf_cache.snapshot("../../etc") is None
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", "/somewhere")
    assert hf_cache.cache_dir() == Path("/somewhere/hub")


def test_a_repo_id_resolves_from_the_cache_plain_or_hf_prefixed(hf_models: Path):
    for name in (QWEN_REPO, f"hf:{QWEN_REPO}"):
        tokenizer = get_tokenizer(name)
        assert isinstance(tokenizer, HFTokenizer)
        assert tokenizer.source == str(hf_cache.snapshot(QWEN_REPO))
        assert tokenizer.token_id("<|im_end|>") == tokenizer.eos_id
        assert tokenizer.bos_id is None and tokenizer.chat_template
    assert isinstance(get_tokenizer("local/tiny"), ByteTokenizer)


def test_the_tokenizer_setting_overrides_the_base_models(hf_models: Path):
    by_repo = get_tokenizer("Qwen/Qwen3-4B", tokenizer=LLAMA_REPO)
    assert by_repo.token_id("<|eot_id|>") == by_repo.eos_id
    by_directory = get_tokenizer("local/tiny", tokenizer=str(hf_cache.snapshot(QWEN_REPO)))
    assert by_directory.token_id("<|im_end|>") == by_directory.eos_id


def test_offline_a_missing_tokenizer_names_the_model_and_how_to_provide_it(hf_models: Path):
    with pytest.raises(ValueError) as missing:
        get_tokenizer("Qwen/Qwen3-4B")
    message = str(missing.value)
    for part in ("'Qwen/Qwen3-4B'", str(hf_models), "HF_HUB_OFFLINE", "hf download Qwen/Qwen3-4B"):
        assert part in message
    assert "`tokenizer`" in message
    with pytest.raises(ValueError, match="'not-a-repo' is neither a directory nor a Hugging"):
        get_tokenizer("Qwen/Qwen3-4B", tokenizer="not-a-repo")


def test_online_a_failed_download_says_why(hf_models: Path, monkeypatch):
    """Where downloads are on, the tokenizer is fetched into the cache; a failure (here the
    download itself, stubbed: this machine has no network) is one clear error."""
    import transformers

    def no_network(repo_id, cache_dir):
        assert (repo_id, cache_dir) == ("Qwen/Qwen3-4B", str(hf_models))
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_network)
    with pytest.raises(ValueError, match=r"could not be downloaded \(We couldn't connect"):
        get_tokenizer("Qwen/Qwen3-4B")


@pytest.mark.parametrize("name", ["gpt", "a/b/c", "hf:../x", "org/.."])
def test_a_name_that_is_no_repo_id_is_refused(hf_models: Path, name: str):
    with pytest.raises(ValueError, match="not a Hugging Face repo id"):
        get_tokenizer(name)


def test_a_missing_directory_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="no such directory"):
        get_tokenizer(f"hf:{tmp_path / 'missing'}")
