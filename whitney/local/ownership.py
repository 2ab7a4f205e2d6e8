"""`Ownership`: the lock a live server holds on its data directory, so that a directory has
one live owner and a starting server takes over its runs only when that owner is dead; and
`start_on_first_free`, how `whitney-flows run` finds a directory while others are in use.

The lock is `flock` on `<data dir>/server.lock`, which holds the owner's PID: the kernel
releases it when the owner's process ends, however it ends (SIGKILL included).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from whitney.local.embedded import EmbeddedWhitney, ServerStartError

LOCK_FILE = "server.lock"
PID_WAIT_S = 1.0
"""How long a refused start waits for the owner to write its PID (it does so right after it
takes the lock)."""
MAX_SIBLINGS = 99
"""How many directories `siblings` offers besides the first."""


class DataDirOwned(ServerStartError):
    """A live server owns the data directory."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        owner = "another live server" if pid is None else f"a live server (PID {pid})"
        super().__init__(f"data directory {str(data_dir)!r} is in use by {owner}")
        self.data_dir = data_dir
        self.pid = pid


class Ownership:
    """The held lock on one data directory, until `release` (or the process's end)."""

    def __init__(self, data_dir: Path) -> None:
        """Take the directory's lock; DataDirOwned naming the owner's PID if a live process
        holds it."""
        self.data_dir = data_dir
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = owner_pid(fd)
            os.close(fd)
            raise DataDirOwned(data_dir, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Let another server take the directory (idempotent)."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # names no owner once there is none
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


def owner_pid(fd: int) -> int | None:
    """The PID the owner wrote in the lock file, waiting up to PID_WAIT_S for it; None if
    none appears."""
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", "replace")
        if text.endswith("\n") and text.strip().isdigit():  # written whole
            return int(text)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def siblings(data_dir: Path) -> Iterator[Path]:
    """`data_dir`, then `<data_dir>-2`, `<data_dir>-3`, ... (MAX_SIBLINGS of them): where
    `whitney-flows run` looks for a directory no live server owns."""
    yield data_dir
    for number in range(2, MAX_SIBLINGS + 2):
        yield data_dir.with_name(f"{data_dir.name}-{number}")


def start_on_first_free(data_dir: Path, **options: Any) -> EmbeddedWhitney:
    """An `EmbeddedWhitney(DIR, **options)` started on the first of `siblings(data_dir)` no
    live server owns; ServerStartError if every one is owned."""
    for candidate in siblings(Path(data_dir).expanduser()):
        try:
            return EmbeddedWhitney(candidate, **options).start()
        except DataDirOwned:
            continue
    raise ServerStartError(f"data directories {str(data_dir)!r} to {str(candidate)!r} are in use")
