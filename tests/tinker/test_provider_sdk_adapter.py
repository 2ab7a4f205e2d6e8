"""`whitney.local.tinker_sdk` pinned to the SDK version it reaches into: a training client's
position read back, and a client opened again on the model (on a new holder of its session) at
an earlier request id resends under the same Tinker seq_id, which the front answers from its
record, then goes on at the next one."""

from __future__ import annotations

import tinker
from tinker import types

from tests.local.served import ServedWhitney
from tests.tinker.steps import ADAM, BASE_MODEL, KEYS, RANK, sdk_key
from tests.tinker.test_tinker_provider import front_runs, tinker_key
from whitney import WhitneyClient
from whitney.local import tinker_sdk


def test_the_sdk_is_the_pinned_version() -> None:
    assert tinker.__version__ == tinker_sdk.PINNED_SDK


def test_a_client_opened_again_resends_under_the_recorded_seq_id(server: ServedWhitney) -> None:
    adam = types.AdamParams(**ADAM)
    before = {run["run_id"] for run in front_runs(server)}
    with tinker_key(sdk_key(0)):
        service = tinker.ServiceClient(base_url=server.url)
        training = service.create_lora_training_client(base_model=BASE_MODEL, rank=RANK).result()
        start = tinker_sdk.position(service, training)
        assert (start.model_id, start.next_request_id) == (str(training.model_id), 0)
        first = training.optim_step(adam).result()
        assert tinker_sdk.position(service, training).next_request_id == 1

        # a broker restart: a new holder on the same session, back at request 0
        again, session = tinker_sdk.client_at(server.url, start)
        assert tinker_sdk.position(session, again) == start
        resent = again.optim_step(adam).result()  # seq_id 1 again: answered from the record
        assert resent.metrics == first.metrics
        second = again.optim_step(adam).result()  # seq_id 2: a new step
        assert tinker_sdk.position(session, again).next_request_id == 2
        assert second.metrics is not None
        session.close("success").result()
        service.close("success").result()
    model = next(run for run in front_runs(server) if run["run_id"] not in before)
    with WhitneyClient(server.url, KEYS[0]) as client:
        kinds = [(op.kind, op.seq_id) for op in client.iter_journal(model["run_id"])]
        assert client.get_run(model["run_id"]).step == 2
    assert kinds == [("optim_step", 1), ("optim_step", 2)]
