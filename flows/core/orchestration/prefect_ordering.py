"""The Prefect server's causal ordering of events for its automations, aware of restarts
(`PREFECT_SERVER_EVENTS_CAUSAL_ORDERING`, in
`flows.core.orchestration.prefect_env.SERVER_SETTINGS`).

Prefect 3.9 makes a flow run's state event follow the one before it when they are less than
5 minutes apart (`prefect/server/models/events.py`), and its triggers hold an event whose
leader they have not seen for up to 15 minutes (`PRECEDING_EVENT_LOOKBACK`), waiting for it.
What they have seen is kept in memory (`prefect.server.events.ordering.memory`), so a server
started again has forgotten every event of the one before: a run that was Running before the
restart and is marked Crashed soon after it (its worker reports the SIGKILL, the heartbeat
automation marks it) reaches the resume trigger 15 minutes late. This ordering is Prefect's,
except that a leader the server received before this process started (it is in the events
table) counts as seen: it was handled then, or is lost for good.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from prefect.server.database import provide_database_interface
from prefect.server.events.ordering import memory
from prefect.server.events.schemas.events import ReceivedEvent

STARTED = datetime.now(UTC)
"""When this server process started (imported at its first event)."""


class CausalOrdering(memory.CausalOrdering):
    _instances: dict[str, Any] = {}

    async def wait_for_leader(self, event: ReceivedEvent) -> None:
        leader = event.follows
        if (
            leader is not None
            and leader != event.id
            and not await self.event_has_been_seen(leader)
            and await received_before_start(leader)
        ):
            return
        await super().wait_for_leader(event)


async def received_before_start(event_id: UUID) -> bool:
    """Whether the server received the event before this process started."""
    db = provide_database_interface()
    async with db.session_context() as session:
        result = await session.execute(
            sa.select(db.Event.received).where(db.Event.id == event_id).limit(1)
        )
        received = result.scalar_one_or_none()
    if received is None:
        return False
    if received.tzinfo is None:  # SQLite may give it back naive, in UTC
        received = received.replace(tzinfo=UTC)
    return received < STARTED
