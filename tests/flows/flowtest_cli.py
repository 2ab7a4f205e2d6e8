"""What the `whitney-flows run FLOW` tests share: the console script run as a user would, the
adapter it downloads, and a bad config refused before any session opens."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from flows.cli.main import main
from whitney.client import WhitneyClient

CONSOLE_SCRIPT = Path(sys.executable).with_name("whitney-flows")


def run_console_script(flow: str, tmp_path: Path, metrics: Path, *arguments: str) -> str:
    """`whitney-flows run FLOW --metrics-out METRICS [ARGUMENTS]` in `tmp_path`, on the
    embedded server (no WHITNEY_API_* variables) and this session's Prefect API; it must
    succeed. Its stdout."""
    argv = [str(CONSOLE_SCRIPT), "run", flow, "--metrics-out", str(metrics), *arguments]
    return run_ok(argv, tmp_path, console_environment(tmp_path / "data"), timeout=400)


def console_environment(data_home: Path) -> dict[str, str]:
    """This environment for the console script on the embedded server (no WHITNEY_API_*
    variables), its data under `data_home` (XDG_DATA_HOME), on this session's Prefect API."""
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("WHITNEY_API_")
    }
    return environment | {
        "XDG_DATA_HOME": str(data_home),
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "COLUMNS": "200",
    }


def run_ok(argv: list[str], cwd: Path, environment: dict[str, str], timeout: float) -> str:
    """Run a command that must succeed (else its output is the failure); its stdout."""
    completed = subprocess.run(
        argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


def assert_downloaded(adapter_dir: Path, output: str) -> None:
    """`adapter_dir` holds one adapter, whose path and sha256 the summary printed, and its
    manifest (flows.core.records.manifest), which lists it with that sha256."""
    adapter, manifest = sorted(adapter_dir.iterdir())
    assert adapter.name.endswith("-adapter.tar") and manifest.name.endswith("-manifest.json")
    sha256 = hashlib.sha256(adapter.read_bytes()).hexdigest()
    assert sha256 in output
    assert str(adapter) in output
    assert json.loads(manifest.read_text())["files"] == {adapter.name: sha256}


Refusal = Callable[[str, list[str], str, str], None]
"""`refused(flow, arguments, field, needle)`, the `refused` fixture (conftest.py)."""


def assert_refused_before_any_session(
    api_url: str,
    inspector: WhitneyClient,
    capsys: pytest.CaptureFixture[str],
    flow: str,
    arguments: list[str],
    field: str,
    needle: str,
) -> None:
    """`whitney-flows run FLOW --api-url API_URL ARGUMENTS` exits 2, its error naming `field`
    and holding `needle`, with no traceback, and opens no session."""
    sessions_before = len(inspector.list_sessions())
    code = main(["run", flow, "--api-url", api_url, *arguments])
    error = capsys.readouterr().err
    assert code == 2
    assert error.startswith(f"whitney-flows run {flow}: {field}: "), error
    assert needle in error
    assert "Traceback" not in error
    assert len(inspector.list_sessions()) == sessions_before


def help_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flow: str
) -> str:
    """The help of `run FLOW`, on one line (argparse wraps it at COLUMNS)."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", flow, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out
