"""The DPO flow on the embedded server, on the example pairs: two cycles with their journal,
records, held-out evaluations and checkpoint; a DPO run whose reference is a checkpoint starts
its policy from it (margins exactly 0 at the start)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from flowtest_helpers import (
    artifacts_of,
    assert_executed_once_in_order,
    assert_finished,
    cycle_artifact,
    flow_run_sessions,
    subflow_runs,
)
from flowtest_settings import QUICK_RECOVERY

from flows.dpo.config import DPOConfig
from flows.dpo.flow import dpo_flow
from whitney.client import WhitneyClient
from whitney.datums import sft_datum
from whitney.local import EmbeddedWhitney
from whitney.payloads import adamw_optimizer
from whitney.tokenizers import BOS_ID, EOS_ID

PAIRS = Path(__file__).resolve().parents[3] / "examples" / "dpo-pairs.jsonl"
TRAIN = ["forward", "forward_backward", "optim_step"]


def small_dpo_config(api_url: str, **updates) -> DPOConfig:
    """Two cycles of 4 example pairs on local/tiny, evaluated after each, a checkpoint after
    the first."""
    settings = {
        "api_url": api_url,
        "base_model": "local/tiny",
        "data_path": str(PAIRS),
        "cycles": 2,
        "pairs_per_cycle": 4,
        "beta": 0.1,
        "learning_rate": 5e-4,
        "checkpoint_every": 1,
        "seed": 1,
        **QUICK_RECOVERY,
    }
    return DPOConfig(**(settings | updates))


def test_two_cycles_journal_records_and_evaluations(
    whitney: EmbeddedWhitney, inspector: WhitneyClient, tmp_path: Path
) -> None:
    metrics_path = tmp_path / "metrics.jsonl"
    config = small_dpo_config(whitney.url, metrics_path=str(metrics_path))
    state = dpo_flow(config, return_state=True)
    result = state.result()

    rows = assert_executed_once_in_order(whitney, result.run_id)
    assert [row["kind"] for row in rows] == [
        *["forward", *TRAIN, "save_state", "forward"],  # held-out before, cycle 0, held-out
        *[*TRAIN, "forward"],
        *["save_state", "export_lora"],
    ]
    reference = [op.kind for op in inspector.journal(result.reference_run_id)]
    assert reference == ["save_weights_for_sampler", "logprobs", "logprobs"]  # 48 pairs, 32 a call
    prefix = f"whitney://runs/{result.run_id}/states/"
    assert result.checkpoint == prefix + "cycle-1"
    assert result.reference == "base:local/tiny"

    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    assert [line["cycle"] for line in lines] == [0, 1]
    assert lines[1]["seq_start"] == lines[0]["seq_end"]
    assert [line["checkpoint"] for line in lines] == [prefix + "cycle-0", None]
    first, second = lines
    assert first["loss"] == math.log(2) and first["margin"] == 0.0  # the policy is the base
    assert first["eval_before"]["accuracy"] == 0.0 and first["eval_before"]["pairs"] == 10
    assert second["loss"] < first["loss"] and second["margin"] > 0
    assert second["chosen_drift"] > second["rejected_drift"]
    assert second["eval"]["accuracy"] > 0.5 and second["eval"]["loss"] < math.log(2)
    for line in lines:
        assert line["kl_sample_train"] == 0.0  # ratio exactly 1
        assert line["pairs"] == 4 and line["grad_norm"] > 0 and line["tokens_trained"] > 0
        assert line["usage"]["forward_backward"]["tokens"] == line["tokens_trained"]
    assert (
        result.eval_after is not None and result.eval_after.accuracy == lines[1]["eval"]["accuracy"]
    )

    flow_run_id = state.state_details.flow_run_id
    parent = {artifact.type: artifact for artifact in artifacts_of(flow_run_id)}
    assert float(parent["progress"].data) == 100.0
    for needle in ("DPO flow summary", "held-out accuracy, after", result.adapter.sha256):
        assert needle in parent["markdown"].data
    cycles = subflow_runs(flow_run_id)
    assert [run.name for run in cycles] == ["cycle-0", "cycle-1"]
    for cycle, run in enumerate(cycles):
        markdown, row = cycle_artifact(run.id)
        assert row["cycle"] == str(cycle)
        assert f"| eval.accuracy | {lines[cycle]['eval']['accuracy']} |" in markdown
        assert "| forward_backward | succeeded |" in markdown
    (session,) = flow_run_sessions(inspector, flow_run_id)
    assert len(assert_finished(inspector, session.session_id)) == 2  # policy and reference


def trained_checkpoint(client: WhitneyClient) -> str:
    """A local/tiny checkpoint one SFT step away from the base model."""
    session = client.open_session({"test": "dpo-reference"})
    run_id = client.create_run(session.session_id, "local", "local/tiny", seed=2).run_id
    datum = sft_datum([BOS_ID, *b"1+1="], [*b"2", EOS_ID])
    payload = {"data": [datum], "loss_function": "cross_entropy", "loss_config": {}}
    client.run_operation(run_id, "forward_backward", payload)
    client.run_operation(run_id, "optim_step", {"optimizer": adamw_optimizer(1e-2)})
    saved = client.run_operation(run_id, "save_state", {"name": "sft"})
    client.finish(run_id)
    client.close_session(session.session_id)
    return saved["checkpoint"]


def test_a_checkpoint_reference_is_where_the_policy_starts(
    whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    checkpoint = trained_checkpoint(inspector)
    config = small_dpo_config(whitney.url, reference=checkpoint, cycles=1, eval_every=0)
    result = dpo_flow(config)
    kinds = [op.kind for op in inspector.journal(result.run_id)]
    assert kinds == ["load_state", *TRAIN, "save_state", "export_lora"]
    (only,) = result.cycles
    assert only.loss == math.log(2) and only.margin == 0.0  # it starts at its reference
    assert result.reference == checkpoint and result.eval_after is None


def test_resuming_from_a_cycle_checkpoint_trains_the_same_adapter(
    whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    """The reference is scored anew and cycle 1 trains the same pairs from the restored
    weights and optimizer moments: the adapter is the uninterrupted run's, bit for bit."""
    config = small_dpo_config(whitney.url, base_model="local/nano", eval_every=0, pairs_per_cycle=2)
    whole = dpo_flow(config)
    checkpoint = f"whitney://runs/{whole.run_id}/states/cycle-0"
    resumed = dpo_flow(config.model_copy(update={"resume_from": checkpoint}))
    assert resumed.resumed_from == checkpoint
    assert [cycle.cycle for cycle in resumed.cycles] == [1]
    assert resumed.cycles[0].loss == whole.cycles[1].loss
    assert resumed.adapter.sha256 == whole.adapter.sha256
    assert [op.kind for op in inspector.journal(resumed.run_id)][:1] == ["forward"]
