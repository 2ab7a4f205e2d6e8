"""`whitney-flows export --verify` and what the manifests record, against the real embedded
server: a manifest it cannot read is one line and exit 2; a file added to an export
directory, an archive that is not the server's export_lora, or a manifest with nothing it can
re-hash here is not a pass; `code.dirty` counts untracked files. Every sha256 is hashlib's."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.cli.main import main
from flows.core.records.manifest import archive_path, code_version, with_archive, write_manifest
from whitney.local import EmbeddedWhitney

from .helpers import new_trained_run

EXIT_CHANGED = EXIT_UNVERIFIED = 1
EXIT_BAD_INPUT = 2


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify(target: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`export --verify TARGET`: (exit code, stdout, stderr)."""
    code = main(["export", "--verify", str(target)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("manifest", "says"),
    [
        ({"manifest_version": 1}, "files: missing, or not a table of file -> sha256"),
        ({"manifest_version": 1, "files": ["adapter.tar"]}, "files: missing, or not a table"),
        ({"manifest_version": 1, "files": {"a.bin": "abc"}}, "files: a.bin: 'abc' is not a"),
        (
            {"manifest_version": 1, "files": {"../a.bin": "0" * 64}},
            "files: '../a.bin' is not a path inside the manifest's directory",
        ),
        (
            {"manifest_version": 1, "files": {}, "data_files": {"data_path": "x.jsonl"}},
            "data_files: data_path: not a {path, sha256} table",
        ),
    ],
)
def test_a_manifest_in_another_shape_is_one_line_and_exit_2(
    manifest: dict, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_manifest(manifest, tmp_path / "run-manifest.json")
    code, out, err = verify(path, capsys)
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err.startswith(f"whitney-flows export: --verify: {path}: {says}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_manifest_with_nothing_checkable_does_not_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = write_manifest({"manifest_version": 1, "files": {}}, tmp_path / "empty.json")
    code, out, err = verify(empty, capsys)
    assert code == EXIT_UNVERIFIED
    assert out.splitlines() == [
        "not checkable base model None: no base weights were hashed",
        "1 items, 0 changed",
    ]
    assert err == (
        f"whitney-flows export: --verify: nothing {empty} lists could be re-hashed here: "
        "not verified\n"
    )

    elsewhere = {"path": str(tmp_path / "gone.jsonl"), "sha256": "1" * 64}
    away = {"manifest_version": 1, "files": {}, "data_files": {"data_path": elsewhere}}
    code, out, err = verify(write_manifest(away, tmp_path / "away.json"), capsys)
    assert code == EXIT_UNVERIFIED
    assert out.splitlines() == [
        f"not checkable data data_path: {tmp_path / 'gone.jsonl'} is not there",
        "not checkable base model None: no base weights were hashed",
        "2 items, 0 changed",
    ]
    assert "not verified" in err


@pytest.fixture
def export_dir(exported, tmp_path: Path) -> Path:
    """A copy of the session's PEFT export (tests/export/conftest.py), to change."""
    return Path(shutil.copytree(exported.peft_dir, tmp_path / "adapter"))


def test_a_file_added_to_an_export_directory_is_changed(
    export_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = json.loads((export_dir / "manifest.json").read_text())["files"]
    code, out, _ = verify(export_dir, capsys)
    assert code == 0 and out.splitlines()[-1] == f"{len(listed)} items, 0 changed"

    (export_dir / "base_model" / "extra.safetensors").write_bytes(b"not from the export")
    code, out, _ = verify(export_dir, capsys)
    assert code == EXIT_CHANGED
    lines = out.splitlines()
    assert (
        "changed       file base_model/extra.safetensors: added: the manifest does not list it"
        in lines
    )
    assert lines[-1] == f"{len(listed) + 1} items, 1 changed"
    # the manifest file named directly is the same check
    assert verify(export_dir / "manifest.json", capsys)[0] == EXIT_CHANGED


def test_a_run_manifest_s_archive_is_checked_against_the_server_s_sha256(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `whitney-flows run` writes: the archive's sha256 is recorded only when it is the
    export_lora's, and `--verify` compares the archive with both."""
    archive = archive_path("run-1", tmp_path)
    archive.write_bytes(b"the adapter archive")
    server = sha256(b"the adapter archive")
    manifest = {"manifest_version": 1, "run_id": "run-1", "adapter": {"sha256": server}}
    recorded = with_archive(manifest, archive)
    assert recorded["files"] == {"run-1-adapter.tar": server}
    with pytest.raises(ValueError, match=f"export_lora gave {'2' * 64}: download it again"):
        with_archive({**manifest, "adapter": {"sha256": "2" * 64}}, archive)

    path = write_manifest(recorded, tmp_path / "run-1-manifest.json")
    code, out, _ = verify(path, capsys)
    assert code == 0
    assert out.splitlines()[:2] == [
        f"ok            file run-1-adapter.tar: {server}",
        f"ok            adapter run-1-adapter.tar as the server's export_lora: {server}",
    ]
    # an archive recorded under a sha256 that is not the server's is changed, even though
    # the file still matches what was recorded
    other = b"another archive"
    archive.write_bytes(other)
    mismatched = {**recorded, "files": {"run-1-adapter.tar": sha256(other)}}
    code, out, _ = verify(write_manifest(mismatched, path), capsys)
    assert code == EXIT_CHANGED
    assert out.splitlines()[:2] == [
        f"ok            file run-1-adapter.tar: {sha256(other)}",
        f"changed       adapter run-1-adapter.tar as the server's export_lora: sha256 "
        f"{sha256(other)}, recorded {server}",
    ]


def test_export_refuses_a_flow_manifest_of_another_adapter(
    embedded_server: EmbeddedWhitney, client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The archive the export reads is the run's current export_lora; a flow manifest whose
    `adapter` is another one describes another adapter (an archive that is not its
    export_lora's: tests/export/test_export_command.py)."""
    run_id = new_trained_run(client)
    exported = client.run_operation(run_id, "export_lora", {})
    client.finish(run_id)
    manifest = tmp_path / "flow-manifest.json"
    flow = {"manifest_version": 1, "run_id": run_id, "files": {}, "adapter": dict(exported)}
    write_manifest({**flow, "adapter": {**exported, "sha256": "3" * 64}}, manifest)
    arguments = ["--manifest", str(manifest), "--data-dir", str(embedded_server.data_dir)]
    code = main(["export", run_id, "--out", str(tmp_path / "a"), *arguments])
    assert code == EXIT_BAD_INPUT and not (tmp_path / "a").exists()
    assert capsys.readouterr().err == (
        f"whitney-flows export: --manifest {manifest.resolve()} records the adapter sha256 "
        f"{'3' * 64}, not the run's current export ({exported['sha256']})\n"
    )
    write_manifest(flow, manifest)
    assert main(["export", run_id, "--out", str(tmp_path / "b"), *arguments]) == 0
    written = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert written["adapter"]["sha256"] == exported["sha256"]


def test_code_dirty_counts_untracked_files(tmp_path: Path) -> None:
    def git(*arguments: str) -> str:
        command = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
        return subprocess.run(
            [*command, *arguments], capture_output=True, text=True, check=True
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "module.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("*.log\n")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    (tmp_path / "run.log").write_text("ignored\n")
    clean = code_version(tmp_path)
    assert clean == {
        "git_commit": git("rev-parse", "HEAD"),
        "dirty": False,
        "package_version": None,
    }
    (tmp_path / "new_module.py").write_text("y = 2\n")
    assert code_version(tmp_path)["dirty"] is True
