"""`flows.core.orchestration.prefect_redis_broker` on a real `redis-server` (a temporary one,
by PID): the event persister's group holds its acknowledgements back, so what a consumer
handled but a SIGKILL kept it from writing is still pending, the stream trimmed no further
than it, and a consumer after the restart reads it again and acknowledges it; another group
acknowledges at once, as prefect-redis does. The end-to-end effect (no state event lost
through a Prefect server kill) is tests/e2e/test_stack.py and benchmarks/many_runs.py.
Skipped where redis-server or prefect-redis is missing, outside CI."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path

import pytest

from tests.e2e import redis_broker

pytestmark = pytest.mark.skipif(
    not redis_broker.installed() and not os.environ.get("CI"),
    reason="Redis is not installed (apt-get install redis-server; pip install -e '.[redis]')",
)


async def consume(group: str, name: str, count: int, min_idle_s: float = 30.0) -> list[str]:
    """Run a consumer of `events` in `group` until it has handled `count` messages (the
    last one acknowledged as any other); what it handled."""
    from prefect.server.utilities.messaging import Message, StopConsumer

    from flows.core.orchestration.prefect_redis_broker import Consumer

    handled: list[str] = []

    async def handler(message: Message) -> None:
        handled.append(str(message.data))
        if len(handled) == count:
            raise StopConsumer(ack=True)

    consumer = Consumer(
        "events", group=group, name=name, min_idle_time=timedelta(seconds=min_idle_s)
    )
    await asyncio.wait_for(consumer.run(handler), 60)
    return handled


async def scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_redis.client import clear_cached_clients, get_async_redis_client

    from flows.core.orchestration import prefect_redis_broker as broker

    await clear_cached_clients()
    client = get_async_redis_client()
    for group in ("event-persister", "reactive-triggers"):
        await client.xgroup_create("events", group, id="0", mkstream=True)
    async with broker.Publisher("events", broker.Cache(), deduplicate_by="id") as publisher:
        for index in range(3):
            await publisher.publish_data(f"event {index}".encode(), {"id": str(index)})
    sent = [f"event {index}" for index in range(3)]

    assert await consume("reactive-triggers", "triggers-1", 3) == sent
    assert await consume("event-persister", "persister-1", 3) == sent  # then "SIGKILLed"
    assert (await client.xpending("events", "reactive-triggers"))["pending"] == 0
    assert (await client.xpending("events", "event-persister"))["pending"] == 3
    await broker.trim_to_oldest_pending(client, "events")
    assert await client.xlen("events") == 3

    monkeypatch.setattr(broker, "ACK_AFTER_S", 0.0)
    assert await consume("event-persister", "persister-2", 3, min_idle_s=0.0) == sent
    assert (await client.xpending("events", "event-persister"))["pending"] == 0
    await broker.trim_to_oldest_pending(client, "events")
    assert await client.xlen("events") == 1  # the last one given, as prefect-redis keeps it
    await clear_cached_clients()


def test_the_persister_acknowledges_late_and_a_restarted_one_reads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with redis_broker.running_redis(tmp_path) as redis:
        for name, value in redis.server_env.items():
            monkeypatch.setenv(name, value)
        asyncio.run(scenario(monkeypatch))
