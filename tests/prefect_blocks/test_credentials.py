"""`WhitneyCredentials` and the endpoint resolution (`blocks.endpoint`), against the real
embedded server.

Saving and loading through a Prefect server, the UI's view of the block and the key's
absence from logs and artifacts of real runs are covered end to end in tests/e2e.
"""

from __future__ import annotations

import io
import json
import logging
import random
import subprocess
import sys
from contextlib import ExitStack

import httpx
import pytest
import respx
from pydantic import SecretStr, ValidationError
from rich.console import Console

import whitney.clock
from blocks import BlockNotFound, WhitneyCredentials, load_credentials
from blocks.endpoint import resolve_connection, resolve_endpoint
from flows.cli.run import start_embedded_server
from flows.core.config import ConfigError
from flows.core.loop.budget import flow_cost_model
from whitney.errors import Unauthorized

KEY = "sk-test-blocks-0123456789"


def credentials(**overrides: object) -> WhitneyCredentials:
    fields: dict[str, object] = {"base_url": "http://127.0.0.1:8765/", "api_key": KEY}
    fields.update(overrides)
    return WhitneyCredentials(**fields)


def test_the_key_never_shows_in_repr_dumps_or_the_schema_form():
    block = credentials()
    assert block.base_url == "http://127.0.0.1:8765"
    for text in (
        repr(block),
        str(block),
        str(block.model_dump()),
        block.model_dump_json(),
        json.dumps(block.model_dump(mode="json")),
        repr(block.get_client()),
    ):
        assert KEY not in text
    assert block.api_key.get_secret_value() == KEY
    schema = WhitneyCredentials.model_json_schema()
    assert schema["secret_fields"] == ["api_key", "tinker_api_key"]
    assert schema["properties"]["api_key"]["format"] == "password"
    assert schema["block_type_slug"] == "whitney-credentials"
    described = [name for name, prop in schema["properties"].items() if prop.get("description")]
    assert set(described) == set(schema["properties"])


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"base_url": "127.0.0.1:8765"}, "base_url"),
        ({"api_key": "  "}, "api_key"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"poll_wait_s": 61}, "poll_wait_s"),
        ({"price_table": {"train": 1.0}}, "price_table"),
        ({"price_table": {"sample": -1.0}}, "price_table"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ValidationError) as error:
        credentials(**overrides)
    assert error.value.errors()[0]["loc"][0] == field
    assert KEY not in str(error.value)


def test_the_client_carries_the_settings_and_reaches_the_server(embedded_server):
    block = credentials(
        base_url=embedded_server.url,
        api_key=embedded_server.api_key,
        timeout_s=60,
        max_attempts=2,
        max_retry_seconds=3,
        backoff_base_s=0.01,
        backoff_max_s=0.1,
        poll_wait_s=2,
    )
    with block.get_client() as client:
        assert client.base_url == embedded_server.url
        assert client._transport.timeout == 60 and client._transport.retry.max_attempts == 2
        assert client._transport.retry.max_retry_seconds == 3 and client._poll_wait_s == 2
        assert "local" in client.capabilities().providers
    with (
        credentials(base_url=embedded_server.url).get_client() as client,
        pytest.raises(Unauthorized) as error,
    ):
        client.list_sessions()
    assert KEY not in str(error.value)


def test_cost_estimate_from_the_price_table():
    assert credentials().estimate_cost({"sample": 1000}) is None
    priced = credentials(price_table={"sample": 0.5, "forward_backward": 2.0})
    assert priced.estimate_cost({"sample": 4000, "forward_backward": 500, "optim_step": 9}) == (
        pytest.approx(0.5 * 4 + 2.0 * 0.5)
    )


def test_an_endpoint_from_a_block_keeps_everything_but_shows_no_key(monkeypatch):
    block = credentials(max_attempts=3, backoff_max_s=2.5, price_table={"sample": 1.0})
    monkeypatch.setattr(WhitneyCredentials, "load", lambda name, **kwargs: block)
    endpoint = resolve_endpoint(None, "prod")
    assert endpoint.named_by == "whitney_block"
    connection = endpoint.connection
    assert connection.api_key.get_secret_value() == KEY
    assert (connection.max_attempts, connection.backoff_max_s) == (3, 2.5)
    assert flow_cost_model(None, "prod").cost({"sample": {"tokens": 1000}}) == 1.0
    # every field of the block reaches the flow run's connection, but the price table (the
    # cost model's, above) and the Tinker endpoint (the server's, `serve --tinker-block`): a
    # field the connection lacked would be one no run uses
    not_the_runs = {"price_table", "tinker_base_url", "tinker_api_key"}
    assert set(WhitneyCredentials.model_fields) - not_the_runs == set(connection.model_dump())
    assert connection.model_dump(exclude={"api_key"}) == {
        name: getattr(block, name) for name in connection.model_dump(exclude={"api_key"})
    }
    assert set(connection.model_dump()) == {
        "base_url",
        "api_key",
        "timeout_s",
        "max_attempts",
        "max_retry_seconds",
        "backoff_base_s",
        "backoff_max_s",
        "poll_wait_s",
    }
    assert isinstance(connection.api_key, SecretStr)
    for text in (repr(endpoint), str(endpoint), connection.model_dump_json()):
        assert KEY not in text


def test_a_flow_run_s_connection_backs_off_as_its_block_says(embedded_server, monkeypatch):
    """A flow run's connection (resolve_connection of its `whitney_block`, the client its
    tasks share) waits between retries as the block's backoff settings say. The fault is a
    503 without Retry-After, which the embedded server never sends (its 503s carry
    Retry-After: 0, which skips the backoff), so respx answers it, then the real server's
    capabilities. Full jitter draws each delay in [0, ceiling]: the draw is pinned to the
    ceiling, min(backoff_max_s, backoff_base_s * 2**(attempt - 1))."""
    headers = {"Authorization": f"Bearer {embedded_server.api_key}"}
    answer = httpx.get(
        f"{embedded_server.url}/v1/training/capabilities", headers=headers, timeout=60
    ).json()
    block = credentials(
        base_url="http://whitney.test:9", max_attempts=4, backoff_base_s=0.3, backoff_max_s=0.5
    )
    monkeypatch.setattr(WhitneyCredentials, "load", lambda name, **kwargs: block)
    sleeps: list[float] = []
    monkeypatch.setattr(whitney.clock, "sleep", sleeps.append)
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    busy = httpx.Response(503, json={"error": {"code": "unavailable", "message": "busy"}})
    with respx.mock(base_url=block.base_url, assert_all_called=True) as server:
        route = server.get("/v1/training/capabilities")
        route.side_effect = [busy, busy, busy, httpx.Response(200, json=answer)]
        with resolve_connection(None, "prod").get_client() as client:
            assert "local" in client.capabilities().providers
    assert route.call_count == 4
    assert sleeps == [min(0.5, 0.3 * 2**attempt) for attempt in range(3)] == [0.3, 0.5, 0.5]


def test_a_block_saved_with_the_removed_default_provider_still_loads():
    """`default_provider` was never read (a flow's provider is its config's `provider`) and
    is gone; a block document saved with it loads as Prefect loads one, and no connection
    or client setting takes it."""
    saved = {"base_url": "http://127.0.0.1:8765", "api_key": KEY, "default_provider": "tinker"}
    block = WhitneyCredentials.model_validate(saved)
    assert "default_provider" not in WhitneyCredentials.model_fields
    assert "provider" not in str(block.client_settings())
    assert block.api_key.get_secret_value() == KEY


def test_resolution_without_a_block_reads_the_environment(monkeypatch):
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    monkeypatch.delenv("WHITNEY_API_KEY", raising=False)
    assert resolve_endpoint(None) is None
    assert resolve_endpoint(None, "") is None

    monkeypatch.setenv("WHITNEY_API_URL", "http://whitney.example:9000/")
    with pytest.raises(ValueError, match="WHITNEY_API_KEY"):
        resolve_endpoint(None)

    monkeypatch.setenv("WHITNEY_API_KEY", KEY)
    endpoint = resolve_endpoint(None)
    assert endpoint.named_by == "WHITNEY_API_URL"
    assert endpoint.connection.base_url == "http://whitney.example:9000"
    assert endpoint.connection.api_key.get_secret_value() == KEY
    # an explicit URL (the config's api_url) wins over WHITNEY_API_URL
    explicit = resolve_endpoint("http://other:1")
    assert (explicit.connection.base_url, explicit.named_by) == ("http://other:1", "api_url")


def test_a_url_without_a_key_names_where_the_url_came_from(monkeypatch):
    monkeypatch.delenv("WHITNEY_API_KEY", raising=False)
    monkeypatch.setenv("WHITNEY_API_URL", "http://env:1")
    with pytest.raises(ConfigError) as from_env:
        resolve_endpoint(None)
    assert str(from_env.value) == "WHITNEY_API_URL: reading http://env:1 needs WHITNEY_API_KEY"
    with pytest.raises(ConfigError) as given:
        resolve_endpoint("http://given:2", url_field="--api-url")
    assert str(given.value) == "--api-url: reading http://given:2 needs WHITNEY_API_KEY"


def test_a_named_block_wins_and_a_missing_one_is_an_error(monkeypatch):
    monkeypatch.setenv("WHITNEY_API_URL", "http://env:1")
    monkeypatch.setenv("WHITNEY_API_KEY", "env-key")
    saved = credentials(base_url="http://from-block:2")
    names: list[str] = []

    def load(name: str, **kwargs: object) -> WhitneyCredentials:
        names.append(name)
        if name == "whitney":
            return saved
        raise ValueError(f"Unable to find block document named {name} for block type x")

    monkeypatch.setattr(WhitneyCredentials, "load", load)
    endpoint = resolve_endpoint("http://ignored:3", "whitney")
    assert (endpoint.named_by, endpoint.connection.base_url) == (
        "whitney_block",
        "http://from-block:2",
    )
    with pytest.raises(BlockNotFound, match="python -m blocks save nosuch"):
        load_credentials("nosuch")
    with pytest.raises(ConfigError, match="python -m blocks save nosuch") as error:
        resolve_endpoint(None, "nosuch")
    assert error.value.field == "whitney_block"
    assert names == ["whitney", "nosuch", "nosuch"]


def test_nothing_configured_starts_an_embedded_server(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    monkeypatch.setenv("WHITNEY_API_KEY", "")  # restored after the test, like the server's key
    monkeypatch.delenv("WHITNEY_API_KEY")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    caplog.set_level(logging.DEBUG)
    assert resolve_endpoint(None) is None
    shown = io.StringIO()
    with ExitStack() as stack:
        connection = start_embedded_server(stack, Console(file=shown))
        assert connection.base_url.startswith("http://127.0.0.1:")
        with connection.get_client() as client:
            assert "local" in client.capabilities().providers
        key = connection.api_key.get_secret_value()
    assert key not in caplog.text and key not in shown.getvalue()


def test_blocks_import_neither_flows_nor_tasks():
    code = (
        "import sys, blocks, blocks.__main__\n"
        "print(sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('flows', 'tasks')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_cli_refuses_bad_arguments_before_touching_prefect(monkeypatch, capsys):
    from blocks.__main__ import main

    monkeypatch.setenv("WHITNEY_API_KEY", KEY)
    assert main(["save", "x", "--base-url", "not-a-url"]) == 2
    assert main(["save", "x", "--base-url", "http://h:1", "--price-table", "{"]) == 2
    errors = capsys.readouterr().err
    assert "base_url" in errors and "--price-table" in errors
    assert KEY not in errors
