"""Keep Prefect 3.9's subflow heartbeat teardown out of the cycle loop.

Each sync subflow run starts a heartbeat thread that sleeps in 1 s steps and is joined when
the subflow ends: about 1 s of fixed cost per cycle (measured here: 1.10 s per trivial subflow
run with it, 0.17 s without). The parent flow keeps its own heartbeat, so crash detection of
the flow run is unchanged. The setting cannot be switched off by environment variable, only in
code, through `temporary_settings`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings


@contextmanager
def subflows_without_heartbeat() -> Iterator[None]:
    """Subflow runs started inside this block run without their own heartbeat thread."""
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
