"""A long recomputing backward hands freed heap pages back to the system between its checks."""

from __future__ import annotations

import sys

import pytest

from whitney.local.engine import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_glibc_malloc_trim_is_found_and_runs() -> None:
    function = memory.trim()
    assert function is not None
    assert function(0) in (0, 1)  # 1: memory was released, 0: there was none to release


def test_releasing_checks_every_time_and_trims_at_most_once_an_interval(monkeypatch) -> None:
    trims: list[int] = []
    checks: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append)
    clock = iter([t * memory.TRIM_INTERVAL_S for t in (0.0, 0.2, 0.5, 1.1, 1.3, 2.2)])
    monkeypatch.setattr(memory.time, "monotonic", lambda: next(clock))
    check = memory.releasing(lambda: checks.append(1))
    for _ in range(5):
        check()
    assert len(checks) == 5
    assert len(trims) == 2  # at 1.1 and 2.2 intervals, each an interval after the last


def test_a_raising_check_stops_before_any_trim(monkeypatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append)
    monkeypatch.setattr(memory, "TRIM_INTERVAL_S", 0.0)

    def cancelled() -> None:
        raise InterruptedError

    with pytest.raises(InterruptedError):
        memory.releasing(cancelled)()
    assert trims == []
