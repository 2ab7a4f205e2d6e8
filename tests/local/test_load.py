"""Load: 16 tenants drive a run each at once through `WhitneyClient` on one served process;
no answer is an error (none retried either) and every run ends finished."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from whitney.client import WhitneyClient

from .helpers import adamw, datum, forward, sample_request
from .served import served

TENANTS = 16
CYCLES = 3
KEYS = tuple(f"load-key-tenant-{n:02d}" for n in range(TENANTS))
CE = forward([datum([1, 2, 3, 4], [5, 6, 7])], "cross_entropy")

pytestmark = pytest.mark.timeout(300)


class CountingTransport(httpx.HTTPTransport):
    """httpx's transport, counting the answers by status."""

    def __init__(self, statuses: Counter[int], lock: threading.Lock) -> None:
        super().__init__()
        self.statuses = statuses
        self.lock = lock

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        with self.lock:
            self.statuses[response.status_code] += 1
        return response


def drive(url: str, key: str, transport: httpx.BaseTransport) -> str:
    """One tenant: a session, a run on local/nano, CYCLES of training and sampling, finish;
    the run's final status."""
    with WhitneyClient(url, key, transport=transport) as client:
        session = client.open_session({"test": "load"})
        run_id = client.create_run(session.session_id, "local", "local/nano", seed=7).run_id
        for cycle in range(CYCLES):
            client.run_operation(run_id, "forward_backward", CE)
            client.run_operation(run_id, "optim_step", adamw(1e-3))
            saved = client.run_operation(run_id, "save_weights_for_sampler", {"name": f"c{cycle}"})
            result = client.sampler_operation(
                run_id, saved["sampler_id"], "sample", sample_request([1, 2, 3], 2, 4)
            )
            assert len(result["sequences"]) == 2
        client.finish(run_id)
        return client.wait_terminal(run_id, timeout=120).status


def test_sixteen_tenants_drive_runs_at_once(tmp_path):
    with served(tmp_path, keys=KEYS) as server:
        answers: Counter[int] = Counter()
        lock = threading.Lock()
        started = time.perf_counter()
        with ThreadPoolExecutor(TENANTS) as pool:
            runs = [
                pool.submit(drive, server.url, key, CountingTransport(answers, lock))
                for key in KEYS
            ]
            statuses = [run.result() for run in runs]
        wall = time.perf_counter() - started
        print(
            f"{TENANTS} tenants x {CYCLES} cycles (forward_backward, optim_step, "
            f"save_weights_for_sampler, sample): {wall:.1f} s wall, "
            f"{sum(answers.values())} answers {dict(answers)}, RSS {server.rss_mb():.0f} MiB"
        )
        assert statuses == ["finished"] * TENANTS
        assert set(answers) == {200}
        assert server.alive()
