"""A long recomputing backward hands freed heap pages back to the system between its checks."""

from __future__ import annotations

import sys

import pytest
import torch

from whitney.local.engine import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_glibc_malloc_trim_is_found_and_runs() -> None:
    function = memory.trim()
    assert function is not None
    assert function(0) in (0, 1)  # 1: memory was released, 0: there was none to release


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_the_free_heap_is_measured_and_grows_when_small_tensors_are_freed() -> None:
    free = memory.free_heap()
    assert free is not None
    held = [torch.ones(4096) for _ in range(4096)]  # 64 MiB of heap, below mmap's threshold
    fence = torch.ones(4096)  # above them, kept: glibc's free would give a freed top back itself
    before = free()
    del held
    assert free() >= before + 32 * 2**20
    del fence


def test_releasing_checks_every_time_and_trims_when_the_free_heap_is_large(monkeypatch) -> None:
    trims: list[int] = []
    checks: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append)
    sizes = iter([0, memory.TRIM_FREE_BYTES - 1, memory.TRIM_FREE_BYTES, 5, 3 * 2**30])
    monkeypatch.setattr(memory, "free_heap", lambda: lambda: next(sizes))
    check = memory.releasing(lambda: checks.append(1))
    for _ in range(5):
        check()
    assert len(checks) == 5
    assert len(trims) == 2  # at the third and fifth checks, when the heap held enough free


def test_a_raising_check_stops_before_any_trim(monkeypatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append)
    monkeypatch.setattr(memory, "free_heap", lambda: lambda: memory.TRIM_FREE_BYTES)

    def cancelled() -> None:
        raise InterruptedError

    with pytest.raises(InterruptedError):
        memory.releasing(cancelled)()
    assert trims == []
