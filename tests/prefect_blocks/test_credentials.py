"""`WhitneyCredentials` and the endpoint resolution, against the real embedded server.

Saving and loading through a Prefect server, the UI's view of the block and the key's
absence from logs and artifacts of real runs are covered end to end in tests/e2e.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from pydantic import SecretStr, ValidationError

from blocks import BlockNotFound, WhitneyCredentials, WhitneyEndpoint, resolve_whitney
from blocks.resolve import whitney_endpoint
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
    assert schema["secret_fields"] == ["api_key"]
    assert schema["properties"]["api_key"]["format"] == "password"
    assert schema["block_type_slug"] == "whitney-credentials"
    described = [name for name, prop in schema["properties"].items() if prop.get("description")]
    assert set(described) == set(schema["properties"])


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"base_url": "127.0.0.1:8765"}, "base_url"),
        ({"api_key": "  "}, "api_key"),
        ({"default_provider": "openai"}, "default_provider"),
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
        timeout_s=5,
        max_attempts=2,
        max_retry_seconds=3,
        backoff_base_s=0.01,
        backoff_max_s=0.1,
        poll_wait_s=2,
    )
    with block.get_client() as client:
        assert client.base_url == embedded_server.url
        assert client._timeout == 5 and client._max_attempts == 2
        assert client._max_retry_seconds == 3 and client._poll_wait_s == 2
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


def test_an_endpoint_from_a_block_keeps_everything_but_shows_no_key():
    block = credentials(default_provider="tinker", max_attempts=3, price_table={"sample": 1.0})
    endpoint = WhitneyEndpoint.from_block(block, "prod")
    assert endpoint.source == "block" and endpoint.block_name == "prod"
    assert endpoint.api_key.get_secret_value() == KEY
    assert endpoint.max_attempts == 3 and endpoint.price_table == {"sample": 1.0}
    assert endpoint.provider_for("local", explicitly_set=False) == "tinker"
    assert endpoint.provider_for("modal", explicitly_set=True) == "modal"
    fields = endpoint.connection_fields()
    assert set(fields) == {
        "base_url",
        "api_key",
        "timeout_s",
        "max_attempts",
        "max_retry_seconds",
        "poll_wait_s",
    }
    assert isinstance(fields["api_key"], SecretStr)
    for text in (repr(endpoint), endpoint.describe(), endpoint.model_dump_json()):
        assert KEY not in text
    assert "block 'prod'" in endpoint.describe()


def test_resolution_without_a_block_reads_the_environment(monkeypatch):
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    monkeypatch.delenv("WHITNEY_API_KEY", raising=False)
    assert resolve_whitney(None) is None
    assert resolve_whitney("") is None

    monkeypatch.setenv("WHITNEY_API_URL", "http://whitney.example:9000/")
    with pytest.raises(ValueError, match="WHITNEY_API_KEY"):
        resolve_whitney(None)

    monkeypatch.setenv("WHITNEY_API_KEY", KEY)
    endpoint = resolve_whitney(None)
    assert endpoint.source == "environment"
    assert endpoint.base_url == "http://whitney.example:9000"
    assert endpoint.api_key.get_secret_value() == KEY
    assert endpoint.default_provider is None
    assert endpoint.provider_for("modal", explicitly_set=False) == "modal"
    # an explicit URL (the config's api_url) wins over WHITNEY_API_URL
    assert resolve_whitney(None, api_url="http://other:1").base_url == "http://other:1"


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
    endpoint = resolve_whitney("whitney", api_url="http://ignored:3")
    assert (endpoint.source, endpoint.base_url) == ("block", "http://from-block:2")
    with pytest.raises(BlockNotFound, match="python -m blocks save nosuch"):
        resolve_whitney("nosuch")
    assert names == ["whitney", "nosuch"]


def test_nothing_configured_starts_an_embedded_server(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("WHITNEY_API_URL", raising=False)
    monkeypatch.delenv("WHITNEY_API_KEY", raising=False)
    caplog.set_level(logging.DEBUG)
    with whitney_endpoint(None, data_dir=tmp_path) as endpoint:
        assert endpoint.source == "embedded"
        assert endpoint.base_url.startswith("http://127.0.0.1:")
        with endpoint.get_client() as client:
            assert "local" in client.capabilities().providers
        key = endpoint.api_key.get_secret_value()
    assert key not in caplog.text


def test_blocks_import_neither_flows_nor_tasks():
    code = (
        "import sys, blocks, blocks.__main__\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flows', 'tasks')))\n"
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
