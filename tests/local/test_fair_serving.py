"""Fair serving on a real server (its own process, loopback): one tenant's long-polls and
concurrent requests hold no thread another tenant needs, and past its caps it gets 429 with
Retry-After while the other tenant is never refused."""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from whitney.local import EmbeddedWhitney
from whitney.local.limits import Limits

from .helpers import adamw, assert_error, datum, forward, http, new_run, post_op
from .long_polls import long_poll, op_path, until_held
from .served import ServedWhitney, served

CE = forward([datum([1, 2, 3], [4, 5])], "cross_entropy")
POLLS = 300
LONG_POLL_CAP = 256  # the default max_long_polls_per_tenant
POLL_WAIT_S = 30
B_CALLS = 20
B_BOUND_S = 2.0  # generous for a shared 2-core machine (27 s when long-polls held threads)

pytestmark = pytest.mark.timeout(300)


def op_body(seq_id: int) -> dict:
    return {"seq_id": seq_id, "kind": "forward", "payload": CE}


def async_client(server: ServedWhitney, tenant: int, connections: int) -> httpx.AsyncClient:
    """An async raw HTTP client of `tenant` with room for `connections` at once."""
    return httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {server.keys[tenant]}"},
        timeout=POLL_WAIT_S + 60,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def until_refused(polls: list[asyncio.Task], refused: int, timeout_s: float = 60) -> None:
    """Wait until `refused` of `polls` have been answered 429: all of them were then heard
    (polled; fails past `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = [task.result() for task in polls if task.done()]
        if sum(response.status_code == 429 for response in done) >= refused:
            return
        assert time.monotonic() < deadline, f"fewer than {refused} refused"
        await asyncio.sleep(0.05)


async def timed_calls(client: httpx.AsyncClient, paths: list[str]) -> list[float]:
    """Each GET of `paths`, one after another: its latency in seconds (all must be 200)."""
    latencies = []
    for path in paths:
        started = time.perf_counter()
        response = await client.get(path)
        latencies.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
    return latencies


def report(label: str, latencies: list[float]) -> None:
    median, worst = statistics.median(latencies), max(latencies)
    print(f"{label}: n={len(latencies)} median {median * 1e3:.1f} ms, max {worst * 1e3:.1f} ms")


async def long_polls_against_control_calls(server: ServedWhitney, a_run: str, b_run: str) -> None:
    """A holds POLLS long-polls on its pending operation 2 while B's control calls are timed;
    then A fills the gap and every admitted long-poll answers the succeeded operation."""
    b_paths = ["/v1/sessions", f"/v1/training/runs/{b_run}"] * (B_CALLS // 2)
    async with async_client(server, 0, POLLS + 8) as a, async_client(server, 1, 4) as b:
        report("B idle", await timed_calls(b, b_paths))
        polls = [
            asyncio.create_task(a.get(op_path(a_run, 2), params={"wait_s": POLL_WAIT_S}))
            for _ in range(POLLS)
        ]
        try:
            answers = await while_held(a, b, polls, a_run, b_paths)
        finally:
            for task in polls:
                task.cancel()
    admitted = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    assert len(admitted) == LONG_POLL_CAP and len(refused) == POLLS - LONG_POLL_CAP
    for response in refused:
        error = assert_error(response, 429, "rate_limited", "max_long_polls_per_tenant")
        assert error["details"] == {"limit": "max_long_polls_per_tenant", "max": LONG_POLL_CAP}
        assert float(response.headers["Retry-After"]) > 0
    for response in admitted:
        op = response.json()
        assert (op["seq_id"], op["status"], op["kind"]) == (2, "succeeded", "forward")


async def while_held(
    a: httpx.AsyncClient,
    b: httpx.AsyncClient,
    polls: list[asyncio.Task],
    a_run: str,
    b_paths: list[str],
) -> list[httpx.Response]:
    """Once A's surplus long-polls are refused, time B's calls and try one control call of A;
    then fill the gap (seq_id 1) and collect every long-poll's answer."""
    await until_refused(polls, POLLS - LONG_POLL_CAP)
    held = sum(not task.done() for task in polls)
    print(f"A holds {held} long-polls; {POLLS - held} answered at once")
    busy = await timed_calls(b, b_paths)
    report(f"B under A's {POLLS} long-polls", busy)
    assert max(busy) < B_BOUND_S
    own = await a.get("/v1/sessions")  # A's own control call is not behind its long-polls
    assert own.status_code == 200, own.text
    filled = time.perf_counter()
    assert (await a.post(f"/v1/training/runs/{a_run}/operations", json=op_body(1))).is_success
    answers = await asyncio.gather(*polls)
    print(f"gap filled: every long-poll answered within {time.perf_counter() - filled:.2f} s")
    return answers


async def long_polls_that_time_out(server: ServedWhitney, run_id: str, n: int) -> None:
    """`n` long-polls of 1 s on an operation still ahead of a gap answer it pending."""
    async with async_client(server, 0, n) as a:
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(a.get(op_path(run_id, 4), params={"wait_s": 1}) for _ in range(n))
        )
        waited = time.perf_counter() - started
    print(f"{n} long-polls of 1 s answered pending in {waited:.2f} s")
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers][:3]
    assert {(r.json()["seq_id"], r.json()["status"]) for r in answers} == {(4, "pending")}
    assert waited >= 0.9


def test_long_polls_of_one_tenant_do_not_slow_another(tmp_path):
    with served(tmp_path) as server, server.client(0) as a, server.client(1) as b:
        a_run = new_run(a)["run_id"]
        b_run = new_run(b)["run_id"]
        pending = a.post(f"/v1/training/runs/{a_run}/operations", json=op_body(2))
        assert pending.json()["status"] == "pending"  # ahead of the gap at seq_id 1
        rss_before = server.rss_mb()
        asyncio.run(long_polls_against_control_calls(server, a_run, b_run))
        assert a.post(f"/v1/training/runs/{a_run}/operations", json=op_body(4)).is_success
        asyncio.run(long_polls_that_time_out(server, a_run, LONG_POLL_CAP))
        rss_after = server.rss_mb()
        print(f"server RSS {rss_before:.0f} MiB before, {rss_after:.0f} MiB after")
        assert rss_after < rss_before + 256
        assert server.alive()


async def saturate_requests(server: ServedWhitney, run_id: str, n: int) -> list[httpx.Response]:
    """`n` concurrent operation POSTs ahead of a gap (each holds its request `post_wait_s`),
    while A's long-poll of an operation already pending (seq_id 2, posted first, alone: which
    of the `n` the cap admits depends on their arrival) and B's control call go through."""
    async with async_client(server, 0, n + 4) as a, async_client(server, 1, 2) as b:
        first = await a.post(f"/v1/training/runs/{run_id}/operations", json=op_body(2))
        assert first.json()["status"] == "pending", first.text
        posts = [
            asyncio.create_task(a.post(f"/v1/training/runs/{run_id}/operations", json=op_body(s)))
            for s in range(3, n + 3)
        ]
        await until_refused(posts, 1)
        assert (await b.get("/v1/sessions")).status_code == 200  # B is never refused for A
        poll = await a.get(op_path(run_id, 2), params={"wait_s": 0.2})
        assert poll.status_code == 200, poll.text  # a long-poll is not under the request cap
        return await asyncio.gather(*posts)


def test_the_request_cap_of_a_tenant(tmp_path):
    with served(tmp_path, "--max-requests-per-tenant", "4") as server, server.client(0) as a:
        run_id = new_run(a)["run_id"]
        answers = asyncio.run(saturate_requests(server, run_id, 12))
        admitted = [r for r in answers if r.status_code == 200]
        refused = [r for r in answers if r.status_code != 200]
        print(f"12 concurrent POSTs under a cap of 4: {len(admitted)} admitted, {len(refused)} 429")
        assert len(admitted) >= 4 and refused
        for response in refused:
            error = assert_error(response, 429, "rate_limited", "max_requests_per_tenant")
            assert error["details"] == {"limit": "max_requests_per_tenant", "max": 4}
            assert float(response.headers["Retry-After"]) > 0
            seq_id = json.loads(response.request.content)["seq_id"]
            assert a.get(op_path(run_id, seq_id)).status_code == 404  # refused before any work
        assert all(r.json()["status"] == "pending" for r in admitted)
        assert server.alive()


def test_stopping_the_server_answers_every_long_poll(tmp_path):
    """16 long-polls, all known to wait on the server (its long-poll cap is 16: one more is
    refused), answer at once when it stops."""
    server = EmbeddedWhitney(tmp_path / "data", limits=Limits(max_long_polls_per_tenant=16))
    server.start()
    try:
        with http(server) as a:
            run_id = new_run(a)["run_id"]
            assert a.post(f"/v1/training/runs/{run_id}/operations", json=op_body(2)).is_success

            def poll() -> tuple[int, dict, float]:
                started = time.monotonic()
                with http(server) as client:
                    response = long_poll(client, run_id, 2, POLL_WAIT_S)
                return response.status_code, response.json(), time.monotonic() - started

            with ThreadPoolExecutor(16) as pool:
                polls = [pool.submit(poll) for _ in range(16)]
                until_held(a, run_id, 2)
                server.stop()
                answers = [future.result() for future in polls]
    finally:
        server.stop()
    print(f"server stopped: 16 long-polls answered within {max(a[2] for a in answers):.2f} s")
    assert all(status == 200 and op["status"] == "pending" for status, op, _ in answers)
    assert max(waited for *_, waited in answers) < POLL_WAIT_S / 2


def test_serve_answers_its_long_polls_when_told_to_stop(tmp_path: Path) -> None:
    """SIGTERM wakes every long-poll at once: each answers its pending operation before
    uvicorn's 5 s graceful shutdown would drop it. The 8 long-polls are known to wait on the
    server (its long-poll cap is 8: one more is refused) before the signal."""
    flags = ("--gap-timeout-s", "120", "--max-long-polls-per-tenant", "8")
    with served(tmp_path, *flags) as server, server.client(0) as api:
        run_id = new_run(api)["run_id"]
        assert post_op(api, run_id, 2, "optim_step", adamw()).status_code == 200  # waits on 1
        answers: list[tuple[int, float]] = []

        def held_poll() -> None:
            with server.client(0) as client:
                response = long_poll(client, run_id, 2, 30)
                answers.append((response.status_code, time.monotonic()))

        polls = [threading.Thread(target=held_poll) for _ in range(8)]
        for poll in polls:
            poll.start()
        until_held(api, run_id, 2)
        stopped = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        for poll in polls:
            poll.join(30)
    waits = [at - stopped for _, at in answers]
    print(f"long-polls answered {min(waits):.2f} to {max(waits):.2f} s after SIGTERM")
    assert [status for status, _ in answers] == [200] * 8
    assert max(waits) < 4.0
