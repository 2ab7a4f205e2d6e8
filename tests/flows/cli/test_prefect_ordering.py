"""`flows.core.orchestration.prefect_ordering` on a real Prefect server database (SQLite, in a
temporary
directory): a state event whose leader the server received before this process started goes
through at once; one whose leader is new, or unknown, waits as Prefect's own ordering makes it
(its EventArrivedEarly); the end-to-end effect (a crashed run resumed minutes, not 15, after a
restarted server) is tests/e2e/test_resume.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from prefect.server.database import PrefectDBInterface, provide_database_interface
from prefect.server.events.ordering import EventArrivedEarly
from prefect.server.events.schemas.events import ReceivedEvent
from prefect.server.events.storage.database import write_events
from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

from flows.core.orchestration import prefect_ordering
from flows.core.orchestration.prefect_ordering import CausalOrdering, received_before_start


def state_event(received: datetime, follows: UUID | None = None) -> ReceivedEvent:
    return ReceivedEvent(
        id=uuid4(),
        occurred=received,
        received=received,
        event="prefect.flow-run.Running",
        resource={"prefect.resource.id": f"prefect.flow-run.{uuid4()}"},
        follows=follows,
    )


@pytest.fixture
def database(tmp_path: Path) -> Iterator[PrefectDBInterface]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: url}):
        db = provide_database_interface()
        asyncio.run(db.create_db())
        yield db


def stored(db: PrefectDBInterface, *events: ReceivedEvent) -> None:
    async def write() -> None:
        async with db.session_context(begin_transaction=True) as session:
            await write_events(session, list(events))

    asyncio.run(write())


def test_a_leader_received_before_this_process_started_lets_its_follower_through(
    database: PrefectDBInterface,
) -> None:
    before = state_event(prefect_ordering.STARTED - timedelta(minutes=2))
    stored(database, before)
    follower = state_event(datetime.now(UTC), follows=before.id)

    async def check() -> None:
        assert await received_before_start(before.id)
        ordering = CausalOrdering(scope=f"test-{uuid4()}")
        assert not await ordering.event_has_been_seen(before.id)
        await ordering.wait_for_leader(follower)  # returns: no EventArrivedEarly

    asyncio.run(check())


@pytest.mark.parametrize("leader_stored", [True, False], ids=["received-since", "unknown"])
def test_a_leader_received_since_or_never_makes_its_follower_wait(
    database: PrefectDBInterface, leader_stored: bool
) -> None:
    leader = state_event(datetime.now(UTC))
    if leader_stored:
        stored(database, leader)
    follower = state_event(datetime.now(UTC), follows=leader.id)

    async def check() -> None:
        assert not await received_before_start(leader.id)
        with pytest.raises(EventArrivedEarly):
            await CausalOrdering(scope=f"test-{uuid4()}").wait_for_leader(follower)

    asyncio.run(check())
