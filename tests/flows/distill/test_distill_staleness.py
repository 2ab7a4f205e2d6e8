"""Distillation samples its student off-policy too (max_staleness): each cycle records the
sampler it used and how stale that was, the later cycles' samples are requested by the cycle
that published their sampler, and two runs train the same adapter."""

from __future__ import annotations

from flowtest_distill import small_distill_config

from flows.core.loop.off_policy_schedule import Schedule
from flows.distill.flow import distillation_flow
from tests.local.helpers import journal_rows
from whitney.local import EmbeddedWhitney


def test_the_student_samples_one_step_behind_reproducibly(whitney: EmbeddedWhitney) -> None:
    config = small_distill_config(whitney.url, cycles=4, max_staleness=1, checkpoint_every=0)
    first, second = distillation_flow(config), distillation_flow(config)
    assert first.adapter.sha256 == second.adapter.sha256
    schedule = Schedule(1, 0, config.checkpoint_every, config.cycles)
    assert [cycle.staleness for cycle in first.cycles] == [0, 1, 1, 1]
    assert [cycle.sampler_id for cycle in first.cycles] == [
        f"cycle-{schedule.sampler_cycle(n)}" for n in range(4)
    ]
    assert first.cycles[0].kl_sample_train == 0.0
    rows = journal_rows(whitney, first.run_id)
    samples = [row for row in rows if row["kind"] == "sample"]
    assert [row["sampler_id"] for row in samples] == ["cycle-0"] * 4 + ["cycle-1", "cycle-1"] + [
        "cycle-2",
        "cycle-2",
    ]
    assert all(row["executions"] == 1 for row in rows)
