"""What is billed on Tinker: which of a forwarded run's operations reach the Tinker endpoint
(counted by a proxy in front of the embedded Tinker front), which stay on the broker, and the
tokens each records against the tokens the Tinker side journaled for it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.local.served import ServedWhitney, served
from tests.tinker.steps import KEYS, adapter_sha256, sdk_key, through_whitney
from tests.tinker.test_provider_faults import fault_proxy
from tests.tinker.test_tinker_provider import front_runs, tinker_key
from whitney import WhitneyClient

BILLED = {
    "forward_backward": "/api/v1/forward_backward",
    "forward": "/api/v1/forward_backward",
    "optim_step": "/api/v1/optim_step",
    "save_weights_for_sampler": "/api/v1/save_weights_for_sampler",
    "sample": "/api/v1/asample",
    "logprobs": "/api/v1/asample",
    "export_lora": "/api/v1/save_weights_external",
}
"""The Tinker request each of the run's operations is (docs/tinker.md, *What is billed*)."""
UNBILLED = {"/api/v1/retrieve_future", "/api/v1/session_heartbeat", "/api/v1/telemetry"}
"""Requests that wait for an answer or keep a session alive: no work, no bill."""


NOT_WORK = (
    "/api/v1/client/",
    "/api/v1/create_session",
    "/api/v1/create_model",
    "/api/v1/get_info",
    "/api/v1/create_sampling_session",
    "/api/v1/samplers/",
    "/api/v1/training_runs",
    "/api/v1/external_weights/",
)
"""Setting up: the session, the model, sampling sessions, and fetching an export's files."""


def requests_by_path(seen: list[tuple[str, float]]) -> Counter[str]:
    return Counter(path for path, _ in seen if path not in UNBILLED)


def test_each_operation_is_one_tinker_request_and_reads_stay_on_the_broker(
    server: ServedWhitney, tmp_path: Path
) -> None:
    before = {run["run_id"] for run in front_runs(server)}
    with (
        fault_proxy(server.url, []) as proxy,
        tinker_key(sdk_key(0)),
        served(tmp_path, "--tinker-url", proxy.url, keys=KEYS) as broker,
    ):
        trace = through_whitney(broker.url, KEYS[0])
        adapter_sha256(broker.url, KEYS[0], trace.run_id)
        sent = requests_by_path(proxy.seen)
        with WhitneyClient(broker.url, KEYS[0]) as client:
            ops = list(client.iter_journal(trace.run_id))
            # reads of the run, its journal and the server: the broker's own, never Tinker's
            run = client.get_run(trace.run_id)
            client.get_session(run.session_id)
            client.capabilities()
            list(client.iter_journal(trace.run_id))
            client.get_operation(trace.run_id, 1)
        assert requests_by_path(proxy.seen) == sent
    kinds = Counter(op.kind for op in ops)
    billed = Counter()
    for kind, count in kinds.items():
        billed[BILLED[kind]] += count
    work = Counter({path: n for path, n in sent.items() if not path.startswith(NOT_WORK)})
    assert work == billed  # one Tinker request per operation, of the kind it is
    assert kinds["forward_backward"] == 3 and kinds["sample"] == 1 and kinds["logprobs"] == 1
    # the tokens the broker records for each operation are the ones the Tinker side counted;
    # Tinker serves `logprobs` (compute_logprobs) as a sample of one token with the prompt's
    # logprobs, which it also counts as a sample: its prefill and the one token
    model = next(r for r in front_runs(server) if r["run_id"] not in before)
    with WhitneyClient(server.url, KEYS[0]) as client:
        front_ops = list(client.iter_journal(model["run_id"]))
    broker_tokens, front_tokens = Counter(), Counter()
    for op in ops:
        broker_tokens[op.kind] += op.usage["tokens"]
    for op in front_ops:
        front_tokens[op.kind] += op.usage.get("tokens", 0)
    for kind in ("forward_backward", "forward", "logprobs", "optim_step", "export_lora"):
        assert front_tokens[kind] == broker_tokens[kind], kind
    scored = kinds["logprobs"]  # one sequence each
    assert front_tokens["sample"] == broker_tokens["sample"] + broker_tokens["logprobs"] + scored
    assert broker_tokens["forward_backward"] > 0 and broker_tokens["sample"] > 0
