"""The project's Prefect server settings (flows.core.orchestration.prefect_env): `whitney-flows run`
puts them
in the environment its ephemeral Prefect server starts with, under a user's own values, and
docs/prefect-server.md's `prefect server start` step exports the same."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from prefect.settings import Settings

from flows.cli.main import main
from flows.core.orchestration.prefect_env import (
    PREFECT_ENV_DEFAULTS,
    REDIS_BROKER_SETTINGS,
    SERVER_SETTINGS,
)

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "prefect-server.md"
RECORDER_BATCH_SIZE = "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"


@pytest.fixture
def unset_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of PREFECT_ENV_DEFAULTS set; each restored (or removed again) after the test."""
    for name in PREFECT_ENV_DEFAULTS:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_a_run_starts_prefect_with_the_server_settings(
    unset_defaults: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "rl", "--cycles", "0"]) == 2  # refused after the defaults are set
    services = Settings().server.services
    assert services.task_run_recorder.batch_size == 100
    assert services.task_run_recorder.read_batch_size == 50
    assert services.task_run_recorder.flush_interval == 1
    assert services.event_persister.batch_size == 200
    assert services.event_persister.read_batch_size == 100
    assert services.event_persister.flush_interval == 1
    assert "cycles" in capsys.readouterr().err


def test_a_users_own_value_wins(unset_defaults: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RECORDER_BATCH_SIZE, "7")
    assert main(["run", "rl", "--cycles", "0"]) == 2
    services = Settings().server.services
    assert services.task_run_recorder.batch_size == 7
    assert services.event_persister.batch_size == 200


def test_the_guide_exports_the_server_settings_before_prefect_server_start() -> None:
    step = GUIDE.read_text().split("# 1. The Prefect server.", 1)[1].split("prefect server")[0]
    exported = dict(re.findall(r"^export (PREFECT_SERVER_\w+)=(\S+)$", step, re.M))
    assert exported == SERVER_SETTINGS


def test_the_redis_broker_settings_are_prefects_and_prefect_redis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefect.server.utilities.messaging import BrokerModule, CacheModule
    from prefect_redis.messaging import (
        RedisMessagingConsumerSettings,
        RedisMessagingPublisherSettings,
    )

    from flows.core.orchestration.prefect_redis_broker import ACK_AFTER_S

    for name, value in {**SERVER_SETTINGS, **REDIS_BROKER_SETTINGS}.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert isinstance(
        importlib.import_module(settings.server.events.messaging_broker), BrokerModule
    )
    assert isinstance(importlib.import_module(settings.server.events.messaging_cache), CacheModule)
    assert settings.server.services.event_persister.batch_size == 200
    assert RedisMessagingPublisherSettings().batch_size == 1
    assert RedisMessagingConsumerSettings().min_idle_time.total_seconds() > ACK_AFTER_S
