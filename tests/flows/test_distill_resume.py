"""A distillation resumed from a `cycle-N` checkpoint trains exactly as an undisturbed one:
the student's checkpoint restores weights and optimizer, the teacher is the same checkpoint
again, and every seed derives from (seed, cycle, prompt index)."""

from __future__ import annotations

from flows.distill import distillation_flow
from flows.distill_plan import DistillationConfig
from tasks.retry import TaskRetrySettings
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


def test_resume_from_a_cycle_checkpoint_gives_the_undisturbed_adapter(
    whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    config = DistillationConfig(
        api_url=whitney.url,
        base_model="local/nano",
        prompts="lowercase",
        cycles=4,
        prompts_per_cycle=2,
        samples_per_prompt=2,
        max_tokens=8,
        teacher_chunk_size=2,
        checkpoint_every=2,
        seed=3,
        task_retry=TaskRetrySettings(retries=2, delay_s=0.05, max_delay_s=0.2, jitter=0.1),
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
