"""`whitney-flows serve` / `python -m whitney.local`: start, answer, stop; clear exit 2 on
start-up failures."""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from whitney.local import cli


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.fixture(autouse=True)
def one_key(monkeypatch):
    """The server's key where an operator puts it: WHITNEY_LOCAL_API_KEYS."""
    monkeypatch.setenv("WHITNEY_LOCAL_API_KEYS", "k")


def test_port_in_use_exits_2_with_one_line(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code = cli.main(["serve", "--port", str(port), "--data-dir", str(tmp_path)])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert f"127.0.0.1:{port}" in line and "in use" in line


def test_unwritable_data_dir_exits_2_with_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code = cli.main(["serve", "--port", "0", "--data-dir", str(blocker / "data")])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert "not writable" in line and str(blocker) in line


def test_missing_torch_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    code = cli.main(["--port", "0", "--data-dir", str(tmp_path)])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert "torch" in line and "whitney-flows[local]" in line


def test_bad_flags_are_refused(capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["serve", "--fail-before-rate", "2"])
    assert raised.value.code == 2


class Output:
    """A child's stdout lines, read by a thread (no pipe stalls, no lost lines)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.thread = threading.Thread(target=self._pump, args=(process,), daemon=True)
        self.thread.start()

    def _pump(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, pattern: str, timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
            if re.search(pattern, line):
                return self.seen
        raise AssertionError(f"no {pattern!r} in {self.seen!r}")


@pytest.mark.parametrize(
    ("keys_from", "stop"),
    [("env", signal.SIGINT), ("file", signal.SIGINT), ("generated", signal.SIGTERM)],
)
def test_python_m_whitney_local_serves_until_interrupted(tmp_path, keys_from, stop):
    env = dict(os.environ)
    env.pop("WHITNEY_LOCAL_API_KEYS", None)
    options = []
    if keys_from == "env":
        env["WHITNEY_LOCAL_API_KEYS"] = "key-one, key-two"
    if keys_from == "file":
        keys_file = tmp_path / "keys"
        keys_file.write_text("# one tenant a line\nkey-one\n\n  key-two  \n")
        options = ["--api-keys-file", str(keys_file)]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "whitney.local",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        output = Output(process)
        lines = output.until(r"ready at http://")
        url = re.search(r"(http://127\.0\.0\.1:\d+)", lines[-1]).group(1)
        if keys_from in ("env", "file"):
            keys = ["key-one", "key-two"]
            assert not any("generated" in line for line in lines)
        else:
            generated = [line for line in lines if "generated" in line]
            assert len(generated) == 1
            keys = [generated[0].rsplit(" ", 1)[-1].strip()]
        for key in keys:
            answer = httpx.get(
                f"{url}/v1/training/capabilities", headers={"Authorization": f"Bearer {key}"}
            )
            assert answer.status_code == 200
        assert httpx.get(f"{url}/v1/sessions").status_code == 401
        process.send_signal(stop)
        assert process.wait(timeout=30) == 0
        output.until("server stopped")
        assert (tmp_path / "data" / "journal.sqlite3").exists()
        err = process.stderr.read()
        for key in keys:
            assert key not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), ("# no key here\n\n", "holds no API key")],
)
def test_a_bad_keys_file_is_refused_naming_the_flag(tmp_path, content, message):
    keys_file = tmp_path / "keys"
    if content is not None:
        keys_file.write_text(content)
    command = [sys.executable, "-m", "whitney.local", "serve", "--port", "0"]
    command += ["--data-dir", str(tmp_path / "data"), "--api-keys-file", str(keys_file)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("whitney-flows serve: --api-keys-file: ") and message in line


def test_a_key_on_the_command_line_is_warned_about(tmp_path):
    command = [sys.executable, "-m", "whitney.local", "serve", "--port", "0", "--api-key"]
    command += ["key-on-the-command-line", "--api-keys-file", str(tmp_path / "missing")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    warning, refusal = result.stderr.splitlines()
    assert "--api-key is visible to other users of this machine" in warning
    assert "WHITNEY_LOCAL_API_KEYS" in warning and "--api-keys-file" in refusal
    assert "key-on-the-command-line" not in result.stderr
