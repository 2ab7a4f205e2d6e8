"""evaluate-checkpoint: a checkpoint evaluated on a frozen run gives exactly the numbers of the
inline evaluation of the cycle that saved it (the same settings, the same weights: two paths
through the server); the comparison table lists a run's checkpoints in cycle order, version
after version; an SFT checkpoint's eval loss on the held-out split is the SFT flow's own
(`forward` there, `logprobs` on a sampler here); a bad eval set fails before any session."""

from __future__ import annotations

import json

import pytest
from flowtest_helpers import CheckpointedRun, artifacts_of, flow_run_sessions
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from flows.checkpoints.comparison import comparison_key
from flows.checkpoints.config import EvaluateConfig
from flows.checkpoints.evaluate import evaluate_checkpoint
from flows.core.evaluation.config import EvalSettings
from flows.sft.config import SFTConfig
from flows.sft.flow import sft_flow
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

NOT_TIMED = {"seconds"}


def versions(key: str) -> list[list[dict]]:
    """Every version of the table artifact keyed `key`, oldest first, as rows."""
    with get_client(sync_client=True) as prefect:
        found = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return [json.loads(artifact.data) for artifact in sorted(found, key=lambda a: a.created)]


def test_a_checkpoint_evaluates_as_its_cycle_did_inline(
    whitney: EmbeddedWhitney, checkpointed_run: CheckpointedRun, inspector: WhitneyClient
) -> None:
    config, trained = checkpointed_run.config, checkpointed_run.result
    checkpoints = [f"whitney://runs/{trained.run_id}/states/cycle-{n}" for n in range(3)]
    assert trained.checkpoint == checkpoints[-1]
    evaluate = EvaluateConfig(api_url=whitney.url, evaluation=config.eval_settings())
    for checkpoint in reversed(checkpoints):  # out of order: the table sorts by cycle
        state = evaluate_checkpoint(checkpoint, evaluate, return_state=True)
        result = state.result()
        cycle = int(checkpoint.rsplit("-", 1)[1])
        inline = trained.cycles[cycle].eval
        assert result.evaluation.model_dump(exclude=NOT_TIMED) == inline.model_dump(
            exclude=NOT_TIMED
        )
        assert (result.cycle, result.run_id) == (cycle, trained.run_id)
        frozen = inspector.get_run(result.frozen_run_id)
        assert (frozen.trainable, frozen.status) == (False, "finished")
        assert frozen.model_extra["from_checkpoint"] == checkpoint
        (session,) = flow_run_sessions(inspector, state.state_details.flow_run_id)
        assert session.status == "closed"
        (table,) = [a for a in artifacts_of(state.state_details.flow_run_id) if a.type == "table"]
        assert table.key == comparison_key(trained.run_id)

    tables = versions(comparison_key(trained.run_id))
    assert [[row["checkpoint"] for row in rows] for rows in tables] == [
        ["cycle-2"],
        ["cycle-1", "cycle-2"],
        ["cycle-0", "cycle-1", "cycle-2"],
    ]
    for row, cycle in zip(tables[-1], trained.cycles, strict=True):
        assert row["uri"] == checkpoints[cycle.cycle]
        assert row["reward_mean"] == cycle.eval.reward_mean
        assert row["pass_at_k"] == cycle.eval.pass_at_k
        assert row["eval set"] == "env digits"

    bad = EvaluateConfig(api_url=whitney.url, evaluation=EvalSettings(env="nowhere"))
    state = evaluate_checkpoint(checkpoints[0], bad, return_state=True)
    assert state.is_failed()  # before any session: the eval set is checked first
    with pytest.raises(Exception, match="evaluation.env: unknown environment 'nowhere'"):
        state.result()
    assert flow_run_sessions(inspector, state.state_details.flow_run_id) == []


def test_an_sft_checkpoint_evaluates_its_held_out_loss(
    whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    config = SFTConfig(
        api_url=whitney.url, base_model="local/nano", steps=6, steps_per_cycle=3, eval_every=6
    )
    trained = sft_flow(config)
    settings = config.eval_settings()
    assert settings == EvalSettings(env=None, data="corpus", group_size=4, max_tokens=64)
    fewer = settings.model_copy(update={"group_size": 1, "max_tokens": 8})  # sampling: not the loss
    result = evaluate_checkpoint(
        trained.checkpoint, EvaluateConfig(api_url=whitney.url, evaluation=fewer)
    )
    assert result.evaluation.loss == pytest.approx(trained.eval_losses[-1], rel=1e-5)
    assert result.evaluation.loss_tokens is not None and result.evaluation.loss_tokens > 0
    assert result.evaluation.prompts == 31  # the held-out pairs of the built-in corpus
    assert 0.0 <= result.evaluation.reward_mean <= 1.0  # similarity to the reference
