"""A flow rides through its Whitney server's death: `whitney-flows run rl --api-url` against a
served process that is SIGKILLed and started again on the same port and data directory twice
mid-run, once right as a cycle ends and once inside a cycle (an operation of it in flight in
the journal). The flow exits 0 with the adapter sha256 of an undisturbed run of the same
config, and no seq id of the journal ran twice."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from flowtest_restart import (
    assert_no_seq_id_ran_twice,
    kill_and_restart,
    start_flow,
    wait_for_an_operation_in_flight,
    wait_for_cycles,
)

from tests.local.served import ServedWhitney, served

CONFIG = ("--cycles", "5", "--seed", "4", "--base-model", "local/nano")
REBUILT = re.compile(r"run \S+ rebuilt after the restart")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWhitney]:
    with served(tmp_path_factory.mktemp("restart"), "--session-ttl-s", "30") as running:
        yield running


def test_a_flow_whose_server_is_killed_and_restarted_twice_ends_as_an_undisturbed_one(
    server: ServedWhitney, tmp_path: Path
) -> None:
    undisturbed = start_flow(server, tmp_path, "undisturbed", *CONFIG)
    assert undisturbed.wait() == 0, undisturbed.tail()

    flow = start_flow(server, tmp_path, "disturbed", *CONFIG)
    wait_for_cycles(flow, 1)
    away = [kill_and_restart(server)]  # cycle 1 just ended: cycle 2 is starting
    wait_for_cycles(flow, 3)
    wait_for_an_operation_in_flight(server, flow)  # inside cycle 4: sampling or training
    away.append(kill_and_restart(server))
    assert flow.wait() == 0, flow.tail()

    assert flow.adapter_sha256() == undisturbed.adapter_sha256()
    assert len(REBUILT.findall(server.log.read_text())) >= 2
    assert_no_seq_id_ran_twice(server)
    assert max(away) < 30, away
