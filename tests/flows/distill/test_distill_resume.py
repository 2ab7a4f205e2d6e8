"""A distillation resumed from a `cycle-N` checkpoint trains exactly as an undisturbed one:
the student's checkpoint restores weights and optimizer, the teacher is the same checkpoint
again, and every seed derives from (seed, cycle, prompt index). A retried distillation keeps
the teacher an earlier attempt trained by SFT."""

from __future__ import annotations

from pathlib import Path

import pytest
from flowtest_distill import small_distill_config, small_sft_teacher
from flowtest_resume_plugins import fail_once_at_cycle

from flows.distill.flow import distillation_flow
from tasks.names import FLOW_RUN_LABEL, PARENT_FLOW_RUN_LABEL
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


def test_resume_from_a_cycle_checkpoint_gives_the_undisturbed_adapter(
    whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    config = small_distill_config(
        whitney.url, prompts="lowercase", cycles=4, checkpoint_every=2, seed=3
    )
    undisturbed = distillation_flow(config)
    assert [m.checkpoint is not None for m in undisturbed.cycles] == [False, True, False, False]
    checkpoint = undisturbed.cycles[1].checkpoint
    assert checkpoint is not None and checkpoint.endswith("/states/cycle-1")

    resumed = distillation_flow(config.model_copy(update={"resume_from": checkpoint}))
    assert resumed.resumed_from == checkpoint
    assert [m.cycle for m in resumed.cycles] == [2, 3]
    assert [m.teacher_kl for m in resumed.cycles] == [m.teacher_kl for m in undisturbed.cycles[2:]]
    assert resumed.adapter.sha256 == undisturbed.adapter.sha256
    assert resumed.run_id != undisturbed.run_id
    assert inspector.get_session(resumed.session_id).status == "closed"


def test_a_retried_distillation_keeps_the_teacher_an_earlier_attempt_trained(
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = small_distill_config(
        whitney.url,
        prompts="flowtest_resume_plugins:PromptsFailOnceAtCycle",
        cycles=3,
        cycle_retries=0,
        checkpoint_every=1,
        seed=5,
        teacher_sft=small_sft_teacher(steps=3),
    )
    undisturbed = distillation_flow(config)
    assert undisturbed.teacher_sft is not None

    marker = fail_once_at_cycle(monkeypatch, 1, tmp_path)
    state = distillation_flow.with_options(retries=1)(config, return_state=True)
    assert marker.exists(), "the first attempt did not fail at cycle 1"
    assert state.is_completed(), state.message
    retried = state.result()
    flow_run_id = str(state.state_details.flow_run_id)

    # the teacher was trained once, by the first attempt, and the retry distilled from it
    (sft_session,) = inspector.list_sessions(label=f"{PARENT_FLOW_RUN_LABEL}:{flow_run_id}")
    (sft_run,) = inspector.get_session(sft_session.session_id).run_ids or []
    assert inspector.get_run(sft_run).status == "finished"
    assert retried.teacher_sft is None
    assert retried.teacher.startswith(f"whitney://runs/{sft_run}/states/")
    teacher = inspector.get_run(retried.teacher_run_id)
    assert teacher.model_extra["from_checkpoint"] == retried.teacher
    # the student went on from its cycle-0 checkpoint, exactly as an undisturbed run
    assert retried.resumed_from is not None and retried.resumed_from.endswith("/cycle-0")
    assert [m.cycle for m in retried.cycles] == [1, 2]
    assert retried.adapter.sha256 == undisturbed.adapter.sha256
    sessions = inspector.list_sessions(label=f"{FLOW_RUN_LABEL}:{flow_run_id}")
    assert len(sessions) == 2 and {s.status for s in sessions} == {"closed"}

    # the teacher's training counts in the flow run's usage, summed here from its journal
    sft_usage: dict[str, dict[str, int]] = {}
    for operation in inspector.journal(sft_run, limit=1000):
        counters = sft_usage.setdefault(operation.kind, {})
        for name, value in operation.usage.items():
            counters[name] = counters.get(name, 0) + value
    assert sft_usage["forward_backward"]["tokens"] > 0
    assert retried.usage["teacher_sft"] == sft_usage
    assert undisturbed.usage["teacher_sft"]["forward_backward"]["tokens"] > 0
    billed = [c.get("tokens", 0) for usage in retried.usage.values() for c in usage.values()]
    assert retried.total_tokens == sum(billed)  # the budget's count: every run, every kind
