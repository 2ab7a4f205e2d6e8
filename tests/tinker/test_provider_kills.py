"""A broker SIGKILLed while a `save_weights_for_sampler`, an `export_lora` or a `sample` waits
on Tinker (killed once the front has acted on it, its answer held on the wire by a loopback
proxy), then restarted: the operation is sent again under its recorded Tinker ids, which the
front answers from its record (a `sample` goes out again on a new sampling client, so the front
samples it a second time, as Tinker would, with the same seed). Each of the front's operations
ran once, and the results are those of the same run emulated on the CPU engine (the front
itself). A `forward_backward` killed so: tests/tinker/test_tinker_provider.py."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from tests.local.served import ServedWhitney
from tests.tinker.steps import KEYS
from tests.tinker.test_tinker_provider import (
    SAMPLE_REQUEST,
    front_operations,
    front_runs,
    held_chain,
    kill_once_the_front_has_it,
    new_front_model,
    published_run,
)
from whitney import WhitneyClient


def killed_op(client: WhitneyClient, run_id: str, kind: str) -> dict[str, Any]:
    """The operation the kill interrupts (sampler `one` published before it)."""
    if kind == "sample":
        return client.sampler_operation(run_id, "one", "sample", SAMPLE_REQUEST)
    if kind == "save_weights_for_sampler":
        return client.run_operation(run_id, kind, {"name": "two"})
    return client.run_operation(run_id, kind, {})


def result_of(result: dict[str, Any]) -> dict[str, Any]:
    """An operation's result without the id of the artifact (each server names its own)."""
    return {key: value for key, value in result.items() if key != "artifact_id"}


def after(client: WhitneyClient, run_id: str, kind: str) -> list[Any]:
    """What the run gives once the interrupted operation is done: a sample of the sampler it
    published, and the adapter."""
    sampler = "two" if kind == "save_weights_for_sampler" else "one"
    sampled = client.sampler_operation(run_id, sampler, "sample", SAMPLE_REQUEST)
    return [sampled, client.run_operation(run_id, "export_lora", {})["sha256"]]


@pytest.mark.parametrize("kind", ["save_weights_for_sampler", "export_lora", "sample"])
def test_a_broker_killed_mid_operation_sends_it_once(
    server: ServedWhitney, tmp_path: Path, kind: str
) -> None:
    before = {run["run_id"] for run in front_runs(server)}
    with held_chain(server, tmp_path) as (proxy, broker):
        with WhitneyClient(broker.url, KEYS[0]) as client:
            run_id = published_run(client)
            killed_seq = len(list(client.iter_journal(run_id))) + 1
        model_id = new_front_model(server, before)

        def send() -> None:  # its answer is lost with the broker; read again below
            with contextlib.suppress(Exception), WhitneyClient(broker.url, KEYS[0]) as client:
                killed_op(client, run_id, kind)

        killed = kill_once_the_front_has_it(server, proxy, broker, model_id, send)
        assert [k for k, _ in killed][3:] == [kind]
        broker.restart()
        with WhitneyClient(broker.url, KEYS[0]) as client:
            resent = client.get_operation(run_id, killed_seq, wait_s=60)
            assert (resent.kind, resent.status) == (kind, "succeeded"), resent.error
            forwarded = [result_of(resent.result), *after(client, run_id, kind)]
    with WhitneyClient(server.url, KEYS[0]) as client:
        emulated = published_run(client)
        expected = [
            result_of(killed_op(client, emulated, kind)),
            *after(client, emulated, kind),
        ]
    done = front_operations(server, model_id)
    assert forwarded == expected
    first = ["forward_backward", "optim_step", "save_weights_for_sampler"]
    resent = ["sample"] if kind == "sample" else []  # a new sampling client's request
    assert [k for k, _ in done] == [*first, kind, *resent, "sample", "export_lora"]
    assert all(executions == 1 for _, executions in done), done
