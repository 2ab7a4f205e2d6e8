"""`whitney.seq_ids.SeqLedger`, the one seq-id allocator of the client and the flows."""

from __future__ import annotations

import pytest

from whitney.seq_ids import SeqLedger


def test_a_ledger_with_a_loader_asks_for_a_run_once_until_told_to_reload() -> None:
    asked: list[str] = []
    starts = iter([4, 20])

    def load(run_id: str) -> int:
        asked.append(run_id)
        return next(starts)

    ledger = SeqLedger(load=load)
    assert asked == []
    assert ledger.next("run-1") == 4
    assert ledger.reserve("run-1", 3) == range(5, 8)
    ledger.observe("run-1", 10)  # an id used outside the ledger
    assert ledger.position("run-1") == 11
    ledger.observe("run-1", 2)  # behind: nothing moves
    assert ledger.position("run-1") == 11
    assert ledger.reload("run-1") == 20
    assert asked == ["run-1", "run-1"]


def test_forget_loads_again_and_observe_leaves_an_unknown_run_unknown() -> None:
    ledger = SeqLedger(load=lambda run_id: 7)
    ledger.observe("run-1", 30)
    assert ledger.next("run-1") == 7
    ledger.forget("run-1")
    assert ledger.next("run-1") == 7


def test_a_ledger_of_known_starts_goes_on_never_back() -> None:
    ledger = SeqLedger({"run-a": 5})
    ledger.move_to("run-a", 9)
    assert ledger.next("run-a") == 9
    with pytest.raises(ValueError, match="behind"):
        ledger.move_to("run-a", 3)
    with pytest.raises(ValueError, match="cannot reserve"):
        ledger.reserve("run-a", -1)
    with pytest.raises(KeyError, match="no seq start known for run run-b"):
        ledger.position("run-b")
