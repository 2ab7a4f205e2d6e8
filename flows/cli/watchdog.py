"""A watchdog process: once the process that started it is gone (whatever ended it, SIGKILL
included), it stops a process that one started, so that nothing the CLI starts outlives it.

    python -m flows.cli.watchdog PARENT_PID TARGET_PID

`watch(target_pid)` starts it for the calling process. No imports beyond the standard
library: it must start fast and cost nothing while it waits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2
"""How often the watchdog looks at its parent and its target."""
GRACE_S = 5.0
"""How long the target gets to stop after SIGTERM before SIGKILL."""


def alive(pid: int) -> bool:
    """Whether `pid` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop(pid: int) -> None:
    """SIGTERM, then SIGKILL after GRACE_S if `pid` is still there."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(POLL_S / 2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def watch_until_orphaned(parent: int, target: int) -> None:
    """Wait while `parent` is this process's parent and `target` runs; then stop `target`."""
    while os.getppid() == parent and alive(target):
        time.sleep(POLL_S)
    if alive(target):
        stop(target)


def watch(target_pid: int) -> subprocess.Popen[bytes]:
    """Start a watchdog that stops `target_pid` once this process is gone."""
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli.watchdog", str(os.getpid()), str(target_pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the terminal's group does not stop it first
    )


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_until_orphaned(int(sys.argv[1]), int(sys.argv[2]))
