"""`WhitneyClient.iter_journal` against the real embedded server: every operation once, in seq
order, across page boundaries."""

from __future__ import annotations

from whitney.client import WhitneyClient


def test_iter_journal_pages_through_every_operation_in_order(
    whitney_client: WhitneyClient,
) -> None:
    session = whitney_client.open_session({"test": "iter-journal"})
    run = whitney_client.create_run(session.session_id, "local", "local/nano", lora_rank=2)
    for index in range(5):
        whitney_client.run_operation(run.run_id, "save_state", {"name": f"state-{index}"})

    journal = list(whitney_client.iter_journal(run.run_id, page_size=2))
    assert [op.seq_id for op in journal] == [1, 2, 3, 4, 5]
    assert [op.result["checkpoint"].rsplit("/", 1)[1] for op in journal] == [
        f"state-{index}" for index in range(5)
    ]
    exact_pages = list(whitney_client.iter_journal(run.run_id, page_size=5))
    assert [op.seq_id for op in exact_pages] == [1, 2, 3, 4, 5]
    first = next(whitney_client.iter_journal(run.run_id, page_size=2))
    assert first.seq_id == 1
    whitney_client.close_session(session.session_id)
