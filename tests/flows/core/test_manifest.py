"""The manifest of an adapter (flows.core.records.manifest): what the flow records at its normal
end,
what `whitney-flows export` writes beside the adapter, every hash recomputed here with
hashlib; `export --verify` says ok, then changed (exit 1) after one byte of the adapter is
flipped; a promotion's approval is added to it."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from flowtest_parent import Parent, parent_run
from flowtest_sft import small_sft_config

from flows.cli.main import main
from flows.core.records.manifest import (
    add_promotion,
    base_weights,
    data_files,
    verify,
    write_manifest,
)
from flows.sft.flow import sft_flow
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

REPO = Path(__file__).resolve().parents[3]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git(*arguments: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *arguments], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def parent(whitney: EmbeddedWhitney) -> Parent:
    return parent_run(whitney.url)


def test_the_flow_records_what_made_its_adapter(parent: Parent, inspector: WhitneyClient) -> None:
    manifest, result = parent.result.manifest, parent.result
    assert manifest["flow"] == "rl" and manifest["run_id"] == result.run_id
    expected = parent.config.model_dump(mode="json")
    del expected["api_url"], expected["metrics_path"]
    assert manifest["config"] == expected
    base = manifest["base_model"]
    assert (base["name"], base["provider"], base["lora_rank"]) == ("local/tiny", "local", 8)
    assert base["sha256"] is None and "built by the engine" in base["sha256_of"]
    journal = list(inspector.iter_journal(result.run_id))
    exported = [op for op in journal if op.kind == "export_lora"][-1]
    assert manifest["adapter"]["sha256"] == exported.result["sha256"] == result.adapter.sha256
    assert manifest["seq_ids"] == {"first": journal[0].seq_id, "last": exported.seq_id}
    assert manifest["code"]["git_commit"] == git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain") != ""  # untracked files too
    assert manifest["code"]["dirty"] is dirty
    assert [entry["cycle"] for entry in manifest["evaluations"]] == [1, 3]
    evaluated = [cycle.eval.model_dump(mode="json") for cycle in result.cycles if cycle.eval]
    assert [entry["eval"] for entry in manifest["evaluations"]] == evaluated
    assert manifest["lineage"] is None and manifest["promotion"] is None
    assert manifest["data_files"] == {}  # the digits environment reads no file


def test_the_data_files_a_config_names_are_hashed(tmp_path: Path) -> None:
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    config = {"data_path": str(data), "env_options": {"file": str(data)}, "metrics_path": "x"}
    found = data_files(config)
    assert found == {
        "data_path": {"path": str(data.resolve()), "sha256": sha256(data)},
        "env_options.file": {"path": str(data.resolve()), "sha256": sha256(data)},
    }


def test_the_base_weights_on_this_machine_are_hashed_and_verified(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    shards = [model / "model-00001.safetensors", model / "model-00002.safetensors"]
    for index, shard in enumerate(shards):
        shard.write_bytes(bytes([index]) * 1000)
    base = base_weights(f"hf:{model}")
    digests = [sha256(shard) for shard in shards]
    assert base["files"] == {
        str(shard.resolve()): digest for shard, digest in zip(shards, digests, strict=True)
    }
    assert base["sha256"] == hashlib.sha256("\n".join(digests).encode()).hexdigest()
    assert base_weights("nobody/nothing-here")["sha256"] is None
    manifest = tmp_path / "run-manifest.json"
    write_manifest({"manifest_version": 1, "files": {}, "base_model": base}, manifest)
    assert [status for _, status, _ in verify(manifest)] == ["ok", "ok"]
    shards[1].write_bytes(b"other weights")
    assert [status for _, status, _ in verify(manifest)] == ["ok", "changed"]


def test_export_writes_the_manifest_and_verify_finds_a_changed_byte(
    parent: Parent,
    whitney: EmbeddedWhitney,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = parent.result.run_id
    flow_manifest = write_manifest(parent.result.manifest, tmp_path / f"{run_id}-manifest.json")
    out = tmp_path / "adapter"
    code = main(
        ["export", run_id, "--out", str(out), "--manifest", str(flow_manifest)]
        + ["--api-url", whitney.url]
    )
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    written = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert manifest["files"] == {p.relative_to(out).as_posix(): sha256(p) for p in written}
    assert {"adapter_model.safetensors", "base_model/model.safetensors"} <= set(manifest["files"])
    carried = sha256(out / "base_model" / "model.safetensors")
    assert manifest["base_model"]["sha256"] == manifest["base_model"]["exported_sha256"] == carried
    assert manifest["config"] == parent.result.manifest["config"]
    assert manifest["flow_manifest"] == str(flow_manifest.resolve())
    capsys.readouterr()

    assert main(["export", "--verify", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"{len(written)} items, 0 changed"
    assert all(line.startswith("ok ") for line in lines[:-1])

    add_promotion(out, {"approved": True, "note": "good", "checkpoint": parent.checkpoint(3)})
    assert json.loads((out / "manifest.json").read_text())["promotion"]["note"] == "good"
    adapter = out / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-1] ^= 0x01
    adapter.write_bytes(bytes(data))
    assert main(["export", "--verify", str(out)]) == 1
    output = capsys.readouterr().out
    assert f"changed       file adapter_model.safetensors: sha256 {sha256(adapter)}" in output
    assert output.splitlines()[-1] == f"{len(written)} items, 1 changed"


def test_export_without_a_flow_manifest_says_so(
    parent: Parent, whitney: EmbeddedWhitney, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no adapters/RUN-manifest.json here
    out = tmp_path / "adapter"
    assert main(["export", parent.result.run_id, "--out", str(out), "--api-url", whitney.url]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"] is None
    assert manifest["flow_manifest"].startswith("none found (looked for adapters/")


def test_verify_refuses_a_directory_without_a_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "--verify", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--verify: cannot read" in error


def test_an_sft_manifest_hashes_its_data_file(whitney: EmbeddedWhitney, tmp_path: Path) -> None:
    data = tmp_path / "pairs.jsonl"
    pairs = [{"prompt": f"{n} + 1 =", "completion": f" {n + 1}"} for n in range(24)]
    data.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    config = small_sft_config(whitney.url, data_path=str(data), steps=2, steps_per_cycle=2)
    manifest = sft_flow(config).manifest
    assert manifest["flow"] == "sft"
    assert manifest["data_files"] == {
        "data_path": {"path": str(data.resolve()), "sha256": sha256(data)}
    }
    assert manifest["evaluations"] and manifest["evaluations"][0]["evals"]
