"""The Prefect server's message broker on Redis streams (`PREFECT_MESSAGING_BROKER`, in
`flows.core.orchestration.prefect_env.REDIS_BROKER_SETTINGS`): prefect-redis's, except that
the event persister acknowledges an event only once the batch holding it is written, and the
stream keeps what a consumer group has not acknowledged.

Prefect 3.9's event persister takes an event into a batch in memory, written once a second
(`SERVER_SETTINGS`), and prefect-redis acknowledges it as soon as the handler returns: a
SIGKILL of the server loses the batch, as with the in-memory broker. Here the persister's
group acknowledges an event `ACK_AFTER_S` after handling it (ten flush intervals), so an
event the dead server had not written is still pending in its group and read again once the
server is back (prefect-redis claims pending messages idle for
`PREFECT_REDIS_MESSAGING_CONSUMER_MIN_IDLE_TIME`, set above `ACK_AFTER_S`); an event written
twice is one row (its id). Prefect-redis trims the stream up to the last message each group
was given, pending or not; here only up to each group's oldest pending message. The task-run
recorder, which batches too, keeps prefect-redis's acknowledgement (a task-run event read
twice could set an older state again).
"""

from __future__ import annotations

import time
from typing import Any

from prefect_redis.client import get_async_redis_client
from prefect_redis.messaging import Cache, Publisher, break_topic, ephemeral_subscription
from prefect_redis.messaging import Consumer as RedisConsumer
from redis.asyncio import Redis
from redis.exceptions import ResponseError

__all__ = ["Cache", "Consumer", "Publisher", "break_topic", "ephemeral_subscription"]

HELD_GROUP = "event-persister"
"""The consumer group whose acknowledgements wait for its batches to be written."""
ACK_AFTER_S = 10.0
"""How long after handling an event that group acknowledges it: ten flush intervals."""


def stream_id(value: str | bytes) -> tuple[int, int]:
    """A Redis stream id (`<ms>-<seq>`) as a number pair, which orders as the stream does."""
    text = value.decode() if isinstance(value, bytes) else value
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class Consumer(RedisConsumer):
    """Prefect-redis's consumer, its acknowledgements held back in the event persister's group."""

    def __init__(self, topic: str, **kwargs: Any) -> None:
        super().__init__(topic, **kwargs)
        self._held: list[tuple[float, bytes]] = []

    async def _batch_ack(self, redis_client: Redis, ids_to_ack: list[bytes]) -> None:
        if self.group != HELD_GROUP:
            await super()._batch_ack(redis_client, ids_to_ack)
            return
        now = time.monotonic()
        self._held += [(now, message_id) for message_id in ids_to_ack]
        await self._ack_due(redis_client)

    async def _ack_due(self, redis_client: Redis) -> None:
        due = time.monotonic() - ACK_AFTER_S
        ready = [message_id for handled, message_id in self._held if handled <= due]
        self._held = [(handled, message_id) for handled, message_id in self._held if handled > due]
        if ready:
            await redis_client.xack(self.stream, self.group, *ready)

    async def _trim_stream_if_necessary(self, latest_delivered_id: str | None = None) -> None:
        client = get_async_redis_client()
        await self._ack_due(client)  # also when no message came
        now = time.monotonic()
        if self._last_trimmed is None:
            self._last_trimmed = now
        if now - self._last_trimmed > self.trim_every.total_seconds():
            await trim_to_oldest_pending(client, self.stream, latest_delivered_id)
            self._last_trimmed = now


async def trim_to_oldest_pending(
    client: Redis, stream: str, latest_delivered_id: str | None = None
) -> None:
    """Trim the stream below the first message some group still needs: its oldest pending
    message, else the one after the last it was given (and a reader's without a group)."""
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError:
        return  # no stream yet
    floors = []
    if latest_delivered_id and latest_delivered_id != "0-0":
        floors.append(stream_id(latest_delivered_id))
    for group in groups:
        last = group["last-delivered-id"]
        if stream_id(last) == (0, 0):
            continue  # as prefect-redis: a group that has read nothing is not waited for
        pending = await client.xpending(stream, group["name"])
        floors.append(stream_id(pending["min"]) if pending["pending"] else stream_id(last))
    if floors:
        ms, seq = min(floors)
        await client.xtrim(stream, minid=f"{ms}-{seq}", approximate=False)
