"""The official SDK trains, samples and scores through the Tinker routes exactly as
`WhitneyClient` does through Whitney's: the same numbers bit for bit, the same adapter."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

from tests.local.served import ServedWhitney
from tests.tinker.steps import (
    KEYS,
    SL,
    adapter_sha256,
    assert_same,
    sdk_key,
    sl_rows,
    through_tinker,
    through_whitney,
    whitney_datum,
)
from whitney import WhitneyClient


def test_the_sdk_and_whitney_client_give_the_same_bits_and_adapter(server: ServedWhitney) -> None:
    tinker_trace = through_tinker(server.url, sdk_key(0))
    whitney_trace = through_whitney(server.url, KEYS[0])
    assert_same(tinker_trace, whitney_trace)
    assert adapter_sha256(server.url, KEYS[0], tinker_trace.run_id) == adapter_sha256(
        server.url, KEYS[0], whitney_trace.run_id
    )
    # the training learned, and Tinker's cross_entropy is sum(-w_t * lp_t) over the datums
    first_loss, first_logprobs = tinker_trace.losses[0], tinker_trace.logprobs[0]
    expected = 0.0
    for (prompt, _), logprobs in zip(SL, first_logprobs, strict=True):
        weights = np.array([0.0] * (len(prompt) - 1) + [1.0] * (len(logprobs) - len(prompt) + 1))
        expected += float(-(weights * np.asarray(logprobs, np.float64)).sum())
    assert abs(first_loss - expected) < 1e-4 * abs(expected)
    assert tinker_trace.losses[-1] < first_loss
    assert len(tinker_trace.samples) == 2
    assert all(1 <= len(tokens) <= 4 for tokens, _ in tinker_trace.samples)
    assert tinker_trace.prompt_logprobs[0] is None


LOSSES = [
    ("cross_entropy", {}),
    ("importance_sampling", {}),
    ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ("cispo", {}),
    ("dro", {"beta": 0.1}),
]


@pytest.mark.parametrize(("loss", "config"), LOSSES, ids=[name for name, _ in LOSSES])
def test_each_served_loss_is_the_engines_through_both_fronts(
    server: ServedWhitney, loss: str, config: dict[str, float]
) -> None:
    """A forward with each loss: the same loss and logprobs through the SDK (a scalar clip in
    `loss_fn_config`) and through WhitneyClient (the `tinker` provider's per-token tensors)."""
    rows = [
        {**row, "logprobs": [-1.5] * len(row["input"]), "advantages": [0.5] * len(row["input"])}
        for row in sl_rows()
    ]
    service = tinker.ServiceClient(base_url=server.url, api_key=sdk_key(0))
    training = service.create_lora_training_client(base_model="local/tiny", rank=4, seed=9).result()
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(row["input"]),
            loss_fn_inputs={k: v for k, v in row.items() if k != "input"},
        )
        for row in rows
    ]
    ours = training.forward(data, loss, config or None).result()
    with WhitneyClient(server.url, KEYS[0]) as client:
        session = client.open_session().session_id
        run = client.create_run(session, "tinker", "local/tiny", lora_rank=4, seed=9).run_id
        whitney_data = []
        for row in rows:
            datum = whitney_datum(row)
            for key in ("clip_low_threshold", "clip_high_threshold"):
                if key in config:
                    values = [config[key]] * len(row["input"])
                    datum["loss_inputs"][key] = {
                        "dtype": "float32",
                        "shape": [len(values)],
                        "values": values,
                    }
            whitney_data.append(datum)
        scalar = {k: v for k, v in config.items() if k == "beta"}
        payload = {"data": whitney_data, "loss_function": loss, "loss_config": scalar}
        theirs = client.run_operation(run, "forward", payload)
    assert ours.metrics["loss:sum"] == theirs["metrics"]["loss:sum"]
    for output, expected in zip(ours.loss_fn_outputs, theirs["outputs"], strict=True):
        assert (
            np.asarray(output["logprobs"].data, np.float32).tobytes()
            == np.float32(expected["logprobs"]).tobytes()
        )
    if loss == "importance_sampling":  # Tinker's definition: -sum(exp(lp - q) * A), weighted
        expected = 0.0
        for row, output in zip(rows, ours.loss_fn_outputs, strict=True):
            lp = np.asarray(output["logprobs"].data, np.float64)
            ratio = np.exp(lp - np.asarray(row["logprobs"]))
            expected += float(
                -(ratio * np.asarray(row["advantages"]) * np.asarray(row["weights"])).sum()
            )
        assert abs(ours.metrics["loss:sum"] - expected) < 1e-4 * max(1.0, abs(expected))
