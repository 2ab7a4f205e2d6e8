"""What an RL flow run leaves for people: a metrics JSON line and one artifact (its metrics
and operations) per cycle, a progress artifact at 100 %, and a markdown summary naming the
checkpoint, the exported adapter and the command that exports it, and the reward over the first
and last cycles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from flowtest_helpers import artifacts_of, cycle_artifact, subflow_runs
from prefect import flow

from blocks.endpoint import EMBEDDED_URL_ENV, flow_run_api_url
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow

METRIC_FIELDS = {
    "cycle",
    "started_at",
    "seq_start",
    "seq_end",
    "reward_mean",
    "reward_std",
    "sampler_id",
    "staleness",
    "presampled",
    "all_zero_group_share",
    "groups_resampled",
    "groups_dropped",
    "recipe_metrics",
    "auxiliary_seq_end",
    "loss",
    "grad_norm",
    "kl_sample_train",
    "tokens_sampled",
    "tokens_trained",
    "usage",
    "cost",
    "episodes",
    "checkpoint",
    "eval_before",
    "eval",
    "op_seconds",
    "wall_seconds",
}


def test_records_of_a_flow_run(small_config: RLConfig, tmp_path: Path) -> None:
    metrics_path = tmp_path / "metrics.jsonl"
    config = small_config.model_copy(update={"cycles": 2, "metrics_path": str(metrics_path)})
    state = rl_flow(config, return_state=True)
    result = state.result()

    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    assert [line["cycle"] for line in lines] == [0, 1]
    for line in lines:
        assert set(line) == METRIC_FIELDS
        assert set(line["op_seconds"]) - {"save_weights_for_sampler"} == {
            "sample",
            "forward_backward",
            "optim_step",
        }
        assert line["tokens_sampled"] > 0 and line["tokens_trained"] > 0
        assert 0.0 <= line["all_zero_group_share"] <= 1.0
        assert line["staleness"] == 0 and line["presampled"] == []  # on-policy by default
        assert line["sampler_id"]
        assert line["eval_before"] is None  # eval_at_start is off by default
    assert lines[1]["seq_start"] == lines[0]["seq_end"]
    # pipelined: cycle 0 publishes its own sampler and cycle 1's; the last cycle publishes none
    publishes = ["save_weights_for_sampler" in line["op_seconds"] for line in lines]
    assert publishes == [True, False]

    parent = artifacts_of(state.state_details.flow_run_id)
    by_type = {artifact.type: artifact for artifact in parent}
    assert set(by_type) == {"progress", "markdown"}
    assert float(by_type["progress"].data) == 100.0
    summary = by_type["markdown"].data
    for needle in (result.checkpoint, result.adapter.artifact_id, result.adapter.sha256):
        assert needle in summary
    first, last = (f"{cycle['reward_mean']:.3f}" for cycle in lines)
    assert f"| reward, first cycle | {first} |" in summary
    assert f"| reward, last cycle | {last} |" in summary
    export = f"whitney-flows export {result.run_id} --out exports/{result.run_id}"
    assert f"| export | `{export} --api-url {config.api_url}` |" in summary
    for cycle, run in enumerate(subflow_runs(state.state_details.flow_run_id)):
        markdown, row = cycle_artifact(run.id)  # one per cycle: its metrics and operations
        assert markdown.startswith(f"# Cycle {cycle}\n") and row["cycle"] == str(cycle)
        assert float(row["seconds_forward_backward"]) > 0
        assert int(row["tokens_forward_backward"]) > 0
        assert row["seq_end"] == str(lines[cycle]["seq_end"])
        assert "| forward_backward | succeeded |" in markdown
    for artifact in parent:
        assert re.fullmatch(r"[a-z0-9-]+", artifact.key), artifact.key


@flow
def api_url_of(config: RLConfig) -> str | None:
    return flow_run_api_url()


def test_the_export_command_of_a_run_on_the_embedded_server_needs_no_url(
    small_config: RLConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert api_url_of(small_config) == small_config.api_url
    monkeypatch.setenv(EMBEDDED_URL_ENV, small_config.api_url)
    assert api_url_of(small_config) is None
