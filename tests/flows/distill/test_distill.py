"""Distillation end to end on the embedded server, with 200 ms added to every answer: the
student learns the teacher (a smoke of 3 cycles; the 5 cycles whose teacher KL falls below 0.6
of the first's are `python benchmarks/learning_thresholds.py distill`), the teacher's logprobs
tasks really run concurrently (by the server's own records, not by a stopwatch), and neither
the chunking, nor fanning out, nor the task runner changes a bit of the student's adapter
(chunk sizes 1, 4 and all)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flowtest_distill import make_teacher_checkpoint, max_in_flight, recorded_span_s
from flowtest_settings import QUICK_RECOVERY

from flows.core.records.inspection_journal import cycle_groups
from flows.core.records.inspection_sources import ApiJournal
from flows.distill.config import DistillationConfig
from flows.distill.flow import distillation_flow
from flows.distill.metrics import DistillationResult
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

LATENCY_MS = 200
CYCLES = 3
CHUNKS = 8


@pytest.fixture(scope="module")
def slow_server(embedded_server: EmbeddedWhitney) -> Iterator[EmbeddedWhitney]:
    """A server of the module's own that adds 200 ms to every answer (the shared server's
    key, so WHITNEY_API_KEY serves both)."""
    with (
        EmbeddedWhitney(api_keys=[embedded_server.api_key], latency_ms=LATENCY_MS) as server,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setenv("WHITNEY_API_KEY", server.api_key)
        patch.delenv("WHITNEY_API_URL", raising=False)
        yield server


@pytest.fixture(scope="module")
def journal(slow_server: EmbeddedWhitney) -> Iterator[ApiJournal]:
    with WhitneyClient(slow_server.url, slow_server.api_key, backoff_base=0.01) as client:
        yield ApiJournal(client)


@pytest.fixture(scope="module")
def config(journal: ApiJournal, slow_server: EmbeddedWhitney) -> DistillationConfig:
    """8 prompts x 4 samples on local/nano from an SFT'd teacher: 32 sequences, 8 chunks."""
    checkpoint = make_teacher_checkpoint(journal.client, "local/nano")
    return DistillationConfig(
        api_url=slow_server.url,
        base_model="local/nano",
        cycles=CYCLES,
        seed=5,
        teacher_checkpoint=checkpoint,
        prompts_per_cycle=8,
        group_size=4,
        max_tokens=24,
        teacher_chunk_size=4,
        checkpoint_every=0,
        **QUICK_RECOVERY,
    )


@pytest.fixture(scope="module")
def fanned_out(config: DistillationConfig) -> DistillationResult:
    """The reference: 8 teacher logprobs tasks a cycle, submitted together, on threads."""
    assert config.teacher_chunks == CHUNKS
    return distillation_flow(config)


def kinds(journal: ApiJournal, run_id: str) -> list[tuple[int, str, str | None]]:
    return [(op.seq_id, op.kind, op.sampler_id) for op in journal.operations(run_id)]


def teacher_cycles(journal: ApiJournal, run_id: str):
    return [group for group in cycle_groups(journal.operations(run_id)) if group.cycle is not None]


def test_teacher_kl_falls_and_the_student_approaches_the_teacher(
    fanned_out: DistillationResult,
) -> None:
    kl = [metrics.teacher_kl for metrics in fanned_out.cycles]
    print(f"teacher KL {kl}, eval {fanned_out.eval}")
    assert len(kl) == CYCLES
    assert kl[-1] < 0.8 * kl[0], kl
    assert fanned_out.eval is not None
    before, after, teacher = (
        fanned_out.eval.student_before,
        fanned_out.eval.student_after,
        fanned_out.eval.teacher,
    )
    assert teacher < before
    assert after - teacher < 0.8 * (before - teacher), fanned_out.eval
    assert fanned_out.budget_stop is None
    assert fanned_out.usage["teacher"]["logprobs"]["tokens"] > 0
    assert fanned_out.total_tokens == sum(
        counters["tokens"] for usage in fanned_out.usage.values() for counters in usage.values()
    )


def test_teacher_logprobs_ran_concurrently_by_the_servers_records(
    fanned_out: DistillationResult, journal: ApiJournal
) -> None:
    cycles = teacher_cycles(journal, fanned_out.teacher_run_id)
    assert [group.cycle for group in cycles] == list(range(CYCLES))
    for group in cycles:
        logprobs = [op for op in group.operations if op.kind == "logprobs"]
        assert len(logprobs) == CHUNKS
        # Sequential calls never have two in flight; submitted together, all eight were
        # journaled before the first answer could have reached the flow.
        assert max_in_flight(logprobs, LATENCY_MS / 1000) >= CHUNKS // 2, group.label
        print(f"{group.label}: teacher phase {recorded_span_s(group.operations):.3f} s recorded")
    for metrics in fanned_out.cycles:
        assert metrics.teacher_chunks == CHUNKS


def test_chunk_size_all_one_after_another_gives_the_same_adapter(
    fanned_out: DistillationResult, config: DistillationConfig, journal: ApiJournal
) -> None:
    sequential = distillation_flow(
        config.model_copy(update={"teacher_chunk_size": 0, "teacher_fan_out": False})
    )
    assert sequential.adapter.sha256 == fanned_out.adapter.sha256
    assert [m.teacher_kl for m in sequential.cycles] == [m.teacher_kl for m in fanned_out.cycles]
    student_layout = [(seq, kind) for seq, kind, _ in kinds(journal, sequential.run_id)]
    assert student_layout == [(seq, kind) for seq, kind, _ in kinds(journal, fanned_out.run_id)]
    for group in teacher_cycles(journal, sequential.teacher_run_id):
        logprobs = [op for op in group.operations if op.kind == "logprobs"]
        assert len(logprobs) == 1
        assert max_in_flight(group.operations, LATENCY_MS / 1000) == 1


def test_chunk_size_one_gives_the_same_adapter(
    fanned_out: DistillationResult, config: DistillationConfig, journal: ApiJournal
) -> None:
    """One sequence per teacher logprobs task (32 tasks a cycle): the engine's logprobs of a
    sequence do not depend on the sequences beside it, so nothing changes."""
    one_by_one = distillation_flow(config.model_copy(update={"teacher_chunk_size": 1}))
    assert one_by_one.adapter.sha256 == fanned_out.adapter.sha256
    assert [m.teacher_kl for m in one_by_one.cycles] == [m.teacher_kl for m in fanned_out.cycles]
    for group in teacher_cycles(journal, one_by_one.teacher_run_id):
        logprobs = [op for op in group.operations if op.kind == "logprobs"]
        assert len(logprobs) == 8 * 4


def test_the_dask_task_runner_gives_the_same_adapter(
    fanned_out: DistillationResult, config: DistillationConfig, journal: ApiJournal
) -> None:
    pytest.importorskip("prefect_dask")
    on_dask = distillation_flow(
        config.model_copy(update={"task_runner": "dask", "dask_workers": 2})
    )
    assert on_dask.adapter.sha256 == fanned_out.adapter.sha256
    assert kinds(journal, on_dask.run_id) == kinds(journal, fanned_out.run_id)
    assert kinds(journal, on_dask.teacher_run_id) == kinds(journal, fanned_out.teacher_run_id)
    for group in teacher_cycles(journal, on_dask.teacher_run_id):
        logprobs = [op for op in group.operations if op.kind == "logprobs"]
        assert max_in_flight(logprobs, LATENCY_MS / 1000) >= 2, group.label
