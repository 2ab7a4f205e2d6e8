"""The live processes of this machine, read from Linux's /proc, for tests that check what a
command left running."""

from __future__ import annotations

from pathlib import Path


def process_states() -> dict[int, tuple[str, int]]:
    """PID -> (state letter, parent PID) of every process /proc lists now."""
    states = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = stat.rsplit(")", 1)[1].split()
        states[int(entry.name)] = (fields[0], int(fields[1]))
    return states
