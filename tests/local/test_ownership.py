"""A data directory has one live owner (`whitney.local.ownership`): a second server on it is
refused, naming the owner's PID, and takes over its runs only once the owner is dead; `run`'s
embedded server takes the first directory no live server owns."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from whitney.local import EmbeddedWhitney
from whitney.local.ownership import DataDirOwned, start_on_first_free

from .helpers import http, new_run
from .served import served
from .test_recovery import REBUILT, SCRIPT, data_dir, drive, journal


def run_ids(directory: Path) -> list[str]:
    """The runs of the journal in `directory`."""
    with contextlib.closing(sqlite3.connect(directory / "journal.sqlite3")) as connection:
        return [row[0] for row in connection.execute("SELECT run_id FROM runs")]


def test_an_embedded_start_on_a_live_owned_directory_is_refused_naming_the_owner(
    tmp_path: Path,
) -> None:
    with EmbeddedWhitney(tmp_path / "data") as owner:
        with pytest.raises(DataDirOwned) as refused:
            EmbeddedWhitney(tmp_path / "data").start()
        assert str(refused.value) == (
            f"data directory {str(owner.data_dir)!r} is in use by a live server (PID {os.getpid()})"
        )
        assert owner.running  # the refused start left the owner as it was
    with EmbeddedWhitney(tmp_path / "data") as successor:  # released when the owner stopped
        assert successor.data_dir == owner.data_dir


def test_run_takes_the_first_directory_no_live_server_owns(tmp_path: Path) -> None:
    default = tmp_path / "local"
    with (
        start_on_first_free(default) as first,
        start_on_first_free(default) as second,
        start_on_first_free(default) as third,
    ):
        assert [first.data_dir, second.data_dir, third.data_dir] == [
            default,
            tmp_path / "local-2",
            tmp_path / "local-3",
        ]
        with http(second) as api:  # each serves its own journal
            run_id = new_run(api)["run_id"]
        assert [run_ids(server.data_dir) for server in (first, second, third)] == [
            [],
            [run_id],
            [],
        ]
    with start_on_first_free(default) as again:  # all three stopped: the default is free
        assert again.data_dir == default


def test_a_second_serve_refuses_a_live_owned_directory_and_a_killed_owners_run_is_taken_over(
    tmp_path: Path,
) -> None:
    with served(tmp_path, "--session-ttl-s", "0") as server:
        directory = data_dir(server)
        with server.client() as api:
            run_id = new_run(api, seed=5)["run_id"]
            drive(api, run_id, SCRIPT[:4])
        argv = [sys.executable, "-m", "whitney.local", "serve", "--port", "0"]
        second = subprocess.run(
            [*argv, "--data-dir", str(directory)],
            env=os.environ | {"WHITNEY_LOCAL_API_KEYS": "second-key"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stdout == ""
        assert second.stderr == (
            f"whitney-flows serve: data directory {str(directory.resolve())!r} is in use by a "
            f"live server (PID {server.process.pid}): stop it, or give another --data-dir\n"
        )
        with server.client() as api:  # the owner's run goes on, untouched
            drive(api, run_id, SCRIPT[4:7], 5)
        assert REBUILT.findall(server.log.read_text()) == []
        server.kill()
        server.restart()  # the owner is dead: the new server owns the directory, takes over
        with server.client() as api:
            drive(api, run_id, SCRIPT[7:], 8)
    (rebuilt,) = REBUILT.findall(server.log.read_text())
    assert rebuilt[0] == run_id
    rows = journal(directory, run_id)
    assert [row["seq_id"] for row in rows] == list(range(1, len(SCRIPT) + 1))
    assert [row["executions"] for row in rows] == [1] * len(SCRIPT)
