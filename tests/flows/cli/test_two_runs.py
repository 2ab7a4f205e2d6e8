"""Two `whitney-flows run` started together with one data directory (XDG_DATA_HOME), as a new
user would: each run's embedded server owns a directory of its own (the default, then
`local-2`), so neither takes over the other's live run; each operation executes once and
each adapter is the one the run makes alone (a third run, meanwhile, on a data directory of
its own). No process dies, so no operation may have been interrupted either: a server that
took over a live run counts the execution it cut short as interrupted and runs it again.

The second starts while the first's run has an operation outstanding: the first process is
stopped (SIGSTOP) at such a moment until the second's server is up, then continued, so the
overlap does not depend on how long either takes to start on a busy machine."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from flowtest_cli import CONSOLE_SCRIPT, console_environment

from flows.cli.commands import journal_source
from flows.cli.main import main
from whitney.client import WhitneyClient
from whitney.local.config import default_data_dir
from whitney.local.ownership import start_on_first_free

ARGUMENTS = ("run", "rl", "--cycles", "3")
TIMEOUT_S = 400.0
SERVER_LINE = re.compile(r"Embedded Whitney server at \S+ \(data: (\S+?)[;)]")
EXPORT_LINE = re.compile(r"^Export the adapter: (whitney-flows export .+?)\s*$", re.M)
OUTSTANDING = (
    "SELECT operations.run_id FROM runs JOIN operations USING (run_id)"
    " WHERE runs.status = 'ready' AND operations.status IN ('pending', 'running')"
)


def adapter_sha256(directory: Path) -> str:
    """The sha256 of the one adapter the run in `directory` downloaded."""
    (adapter,) = (directory / "adapters").glob("*-adapter.tar")
    return hashlib.sha256(adapter.read_bytes()).hexdigest()


def read_journal(path: Path, query: str) -> list[tuple]:
    """The rows of `query` on the journal at `path`, read-only; none if it is not there yet."""
    if not path.is_file():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
        try:
            return connection.execute(query).fetchall()
        except sqlite3.OperationalError:  # its tables are being created
            return []


def wait_for(condition: object, what: str) -> None:
    """Wait until `condition()` is true, for TIMEOUT_S at most."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {TIMEOUT_S} s for {what}"
        time.sleep(0.1)


def stop_with_work_outstanding(process: subprocess.Popen[str], journal: Path) -> None:
    """Stop `process` (SIGSTOP) at a moment its journal has an operation of a live run not
    finished yet."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        if read_journal(journal, OUTSTANDING):
            process.send_signal(signal.SIGSTOP)
            if read_journal(journal, OUTSTANDING):
                return
            process.send_signal(signal.SIGCONT)
        assert process.poll() is None and time.monotonic() < deadline, "no operation outstanding"
        time.sleep(0.02)


def start(directory: Path, data_home: Path) -> subprocess.Popen[str]:
    """`whitney-flows run rl --cycles 3` in `directory`, its output in directory/output."""
    directory.mkdir()
    with (directory / "output").open("w") as output:
        return subprocess.Popen(
            [str(CONSOLE_SCRIPT), *ARGUMENTS],
            cwd=directory,
            env=console_environment(data_home) | {"PYTHONUNBUFFERED": "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )


def test_two_runs_started_together_on_one_data_directory_each_execute_once(
    tmp_path: Path,
) -> None:
    # the run alone, meanwhile, on a data directory of its own
    alone = start(tmp_path / "alone", tmp_path / "alone-data")
    try:
        data_home = tmp_path / "shared"
        default = data_home / "whitney-flows" / "local"
        first = start(tmp_path / "first", data_home)
        try:
            stop_with_work_outstanding(first, default / "journal.sqlite3")
            second = start(tmp_path / "second", data_home)
            try:
                output = tmp_path / "second" / "output"
                wait_for(lambda: SERVER_LINE.search(output.read_text()), "the second server")
                first.send_signal(signal.SIGCONT)
                assert second.wait(TIMEOUT_S) == 0, output.read_text()
            finally:
                second.kill()
            assert first.wait(TIMEOUT_S) == 0, (tmp_path / "first" / "output").read_text()
        finally:
            first.kill()
        assert alone.wait(TIMEOUT_S) == 0, (tmp_path / "alone" / "output").read_text()
    finally:
        alone.kill()
    undisturbed = adapter_sha256(tmp_path / "alone")

    outputs = [(tmp_path / name / "output").read_text() for name in ("first", "second")]
    directories = [Path(SERVER_LINE.findall(output)[0]) for output in outputs]
    for directory in dict.fromkeys(directories):
        journal = directory / "journal.sqlite3"
        query = "SELECT run_id, seq_id, executions, interrupted FROM operations"
        counts = read_journal(journal, query)
        assert len(counts) > 10, directory
        assert {tuple(row[2:]) for row in counts} == {(1, 0)}, (directory, counts)
    assert directories == [default, default.with_name("local-2")]
    exports = [EXPORT_LINE.findall(output) for output in outputs]
    assert [len(found) for found in exports] == [1, 1]
    assert exports[0][0].endswith(f"exports/{exports[0][0].split()[2]}")
    assert exports[1][0].endswith(f"--data-dir {default.with_name('local-2')}")
    for directory in directories:
        assert len(read_journal(directory / "journal.sqlite3", "SELECT run_id FROM runs")) == 1
    assert [adapter_sha256(tmp_path / name) for name in ("first", "second")] == [undisturbed] * 2


def test_inspect_and_export_find_a_run_in_the_directory_it_was_started_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no --data-dir, a RUN_ID is looked up in `local`, then `local-2`, ...: the second
    of two runs at once is found without one."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    default = default_data_dir()
    with (
        start_on_first_free(default),
        start_on_first_free(default) as second,
        WhitneyClient(second.url, second.api_key) as client,
    ):
        session = client.open_session()
        run_id = client.create_run(session.session_id, "local", "local/nano").run_id
    assert second.data_dir == default.with_name("local-2")
    options = argparse.Namespace(api_url=None, data_dir=None, run_id=run_id)
    assert journal_source(options).path == second.data_dir / "journal.sqlite3"
    assert main(["inspect", run_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["run_id"] == run_id
    assert main(["inspect", "run-0000000000000000"]) == 1
    assert "run-0000000000000000" in capsys.readouterr().err
