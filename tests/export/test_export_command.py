"""`whitney-flows export` on the real embedded server: which archive it takes (the run's
export of its current weights, else a new one from an active run), the three ways to name
the endpoint, and one line with exit code 2 for each bad input, never a traceback or a key."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from flows.cli.main import main
from flows.core.records.inspection_sources import DataDirJournal
from whitney.client import WhitneyClient

from .helpers import export, new_trained_run, train

EXIT_BAD_INPUT = 2


def kinds(client, run_id: str) -> list[str]:
    return [operation.kind for operation in client.iter_journal(run_id)]


def archived_adapter(client, artifact_id: str, tmp_path: Path) -> bytes:
    """adapter_model.safetensors as the server's archive holds it."""
    archive = client.download_artifact(artifact_id, tmp_path / f"{artifact_id}.tar")
    with tarfile.open(archive) as tar:
        return tar.extractfile("adapter_model.safetensors").read()


@pytest.fixture(scope="module")
def finished_run(embedded_server):
    """A trained run that ended as a flow ends: export_lora, then finish."""
    with WhitneyClient(embedded_server.url, embedded_server.api_key) as client:
        run_id = new_trained_run(client)
        artifact_id = client.run_operation(run_id, "export_lora", {})["artifact_id"]
        client.finish(run_id)
    return run_id, artifact_id


def test_a_finished_run_s_export_is_reused(embedded_server, client, finished_run, tmp_path):
    run_id, artifact_id = finished_run
    before = kinds(client, run_id)
    where = {"url": embedded_server.url, "key": embedded_server.api_key}
    assert export(run_id, tmp_path / "out", **where) == 0
    assert kinds(client, run_id) == before
    written = (tmp_path / "out" / "adapter_model.safetensors").read_bytes()
    assert written == archived_adapter(client, artifact_id, tmp_path)


def test_an_active_run_that_trained_since_its_export_exports_again(
    embedded_server, client, tmp_path
):
    run_id = new_trained_run(client)
    stale = client.run_operation(run_id, "export_lora", {})["artifact_id"]
    train(client, run_id, steps=1)
    where = {"url": embedded_server.url, "key": embedded_server.api_key}
    assert export(run_id, tmp_path / "out", **where) == 0
    journal = list(client.iter_journal(run_id))
    assert [op.kind for op in journal].count("export_lora") == 2
    fresh = journal[-1].result["artifact_id"]
    written = (tmp_path / "out" / "adapter_model.safetensors").read_bytes()
    assert written == archived_adapter(client, fresh, tmp_path)
    assert written != archived_adapter(client, stale, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_empty_out_directory_is_filled(embedded_server, finished_run, tmp_path):
    (tmp_path / "out").mkdir()
    where = {"url": embedded_server.url, "key": embedded_server.api_key}
    assert export(finished_run[0], tmp_path / "out", "--merged", **where) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_the_data_dir_given_or_by_default(embedded_server, finished_run, tmp_path, monkeypatch):
    """--data-dir reads the archive from the server's files; with no URL at all, the command
    reads the directory `whitney-flows run` uses ($XDG_DATA_HOME/whitney-flows/local)."""
    run_id = finished_run[0]
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    out = tmp_path / "given"
    assert (
        main(["export", run_id, "--out", str(out), "--data-dir", str(embedded_server.data_dir)])
        == 0
    )
    (tmp_path / "xdg" / "whitney-flows").mkdir(parents=True)
    (tmp_path / "xdg" / "whitney-flows" / "local").symlink_to(embedded_server.data_dir)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert main(["export", run_id, "--out", str(tmp_path / "default")]) == 0
    for name in ("adapter_model.safetensors", "base_model/model.safetensors"):
        assert (tmp_path / "default" / name).read_bytes() == (out / name).read_bytes()


def test_the_url_from_the_environment(embedded_server, finished_run, tmp_path, monkeypatch):
    monkeypatch.setenv("WHITNEY_API_URL", embedded_server.url)
    monkeypatch.setenv("WHITNEY_API_KEY", embedded_server.api_key)
    assert main(["export", finished_run[0], "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "adapter_config.json").is_file()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def bad_inputs(server, finished_run, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Each bad input: (arguments after `export`, what its one line says)."""
    url, data_dir = ["--api-url", server.url], ["--data-dir", str(server.data_dir)]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    return {
        "unknown run": (["run-missing", *url], "no run run-missing at http://"),
        "unknown run in data dir": (["run-missing", *data_dir], "no run run-missing at /"),
        "unreachable server": (["run-x", "--api-url", closed_port_url()], "cannot reach Whitney"),
        "non-empty out": ([finished_run, *url], "is not empty"),
        "out is a file": ([finished_run, *url], "is not a directory"),
        "no data dir": ([finished_run, "--data-dir", str(tmp_path / "none")], "no Whitney journal"),
    }


BAD_INPUTS = (
    "unknown run",
    "unknown run in data dir",
    "unreachable server",
    "non-empty out",
    "out is a file",
    "no data dir",
)
OUT = {"non-empty out": "full", "out is a file": "file"}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(
    case, embedded_server, finished_run, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("WHITNEY_API_KEY", embedded_server.api_key)
    arguments, says = bad_inputs(embedded_server, finished_run[0], tmp_path)[case]
    out = tmp_path / OUT.get(case, "out")
    assert main(["export", arguments[0], "--out", str(out), *arguments[1:]]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("whitney-flows export: ")
    assert says in captured.err
    assert "Traceback" not in captured.err and embedded_server.api_key not in captured.err
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_a_finished_run_without_an_export_is_named(embedded_server, client, tmp_path, capsys):
    run_id = new_trained_run(client)
    client.finish(run_id)
    assert (
        export(run_id, tmp_path / "out", url=embedded_server.url, key=embedded_server.api_key) == 2
    )
    message = f"run {run_id} is finished and has no export_lora of its current weights"
    assert capsys.readouterr().err == f"whitney-flows export: {message}\n"


def test_a_url_without_a_key(embedded_server, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WHITNEY_API_KEY", raising=False)
    assert main(["export", "run-x", "--out", str(tmp_path), "--api-url", embedded_server.url]) == 2
    assert capsys.readouterr().err == (
        f"whitney-flows export: reading {embedded_server.url} needs WHITNEY_API_KEY\n"
    )


def test_without_the_hf_extra(embedded_server, finished_run, tmp_path, monkeypatch, capsys):
    """transformers or peft missing: one line naming the extra, before any request."""
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    where = {"url": embedded_server.url, "key": embedded_server.api_key}
    assert export(finished_run[0], tmp_path / "out", **where) == 2
    assert capsys.readouterr().err == (
        'whitney-flows export: the export needs the hf extra: pip install -e ".[hf]"\n'
    )


def test_no_prefect_import(embedded_server, finished_run, tmp_path):
    """The whole export, in a fresh process, never imports Prefect: the command starts fast."""
    code = (
        "import sys\n"
        "from flows.cli.main import main\n"
        f"code = main(['export', {finished_run[0]!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))\n"
    )
    env = os.environ | {
        "WHITNEY_API_URL": embedded_server.url,
        "WHITNEY_API_KEY": embedded_server.api_key,
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "0 []"


def test_a_broken_archive_leaves_nothing(embedded_server, client, tmp_path, capsys):
    """An archive that is not the one its export_lora made (here not even a tar): one line
    naming both sha256, and neither DIR nor its staging directory."""
    run_id = new_trained_run(client)
    exported = client.run_operation(run_id, "export_lora", {})
    client.finish(run_id)
    archive = DataDirJournal(embedded_server.data_dir).artifact_file(exported["artifact_id"])
    archive.write_bytes(b"junk")
    data_dir = str(embedded_server.data_dir)
    assert main(["export", run_id, "--out", str(tmp_path / "out"), "--data-dir", data_dir]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"whitney-flows export: the archive of {exported['artifact_id']} has sha256 "
        f"{hashlib.sha256(b'junk').hexdigest()}, its export_lora gave {exported['sha256']}\n"
    )
    assert list(tmp_path.iterdir()) == []
