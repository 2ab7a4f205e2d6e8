"""The credentials block's Tinker fields: saved on and loaded from a real (temporary) Prefect
server, the Tinker key redacted everywhere but in the environment of the server that
`whitney-flows serve --tinker-block NAME` starts."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator

import pytest
from prefect.client.orchestration import get_client
from prefect.testing.utilities import prefect_test_harness
from pydantic import ValidationError

from blocks import WhitneyCredentials, load_credentials
from flows.cli import tinker_block
from flows.cli.main import run_command
from flows.core.config import ConfigError

KEY = "sk-test-blocks-0123456789"
TINKER_KEY = "tml-test-tinker-key-9876543210"
TINKER_URL = "https://tinker.example/api"


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def clean_tinker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tinker_block.TINKER_KEY_ENV, raising=False)


def tinker_credentials() -> WhitneyCredentials:
    return WhitneyCredentials(
        base_url="http://127.0.0.1:8765",
        api_key=KEY,
        tinker_base_url=TINKER_URL + "/",
        tinker_api_key=TINKER_KEY,
    )


def test_the_tinker_key_never_shows_and_needs_its_url() -> None:
    block = tinker_credentials()
    assert block.tinker_base_url == TINKER_URL
    for text in (repr(block), str(block), str(block.model_dump()), block.model_dump_json()):
        assert TINKER_KEY not in text and KEY not in text
    schema = WhitneyCredentials.model_json_schema()
    assert schema["secret_fields"] == ["api_key", "tinker_api_key"]
    assert schema["properties"]["tinker_api_key"]["description"]
    with pytest.raises(ValidationError, match="tinker_api_key: give tinker_base_url"):
        WhitneyCredentials(base_url="http://127.0.0.1:1", api_key=KEY, tinker_api_key=TINKER_KEY)
    with pytest.raises(ValidationError, match="tinker_base_url"):
        WhitneyCredentials(base_url="http://127.0.0.1:1", api_key=KEY, tinker_base_url="ftp://x")
    plain = WhitneyCredentials(base_url="http://127.0.0.1:1", api_key=KEY)
    assert (plain.tinker_base_url, plain.tinker_api_key) == (None, None)


async def read_redacted(name: str) -> dict:
    async with get_client() as client:
        document = await client.read_block_document_by_name(
            name, "whitney-credentials", include_secrets=False
        )
    return document.data


def test_the_block_round_trips_through_prefect_and_serve_takes_it(
    prefect_server: None, clean_tinker_env: None
) -> None:
    tinker_credentials().save("whitney-tinker", overwrite=True)
    loaded = load_credentials("whitney-tinker")
    assert loaded.tinker_base_url == TINKER_URL
    assert loaded.tinker_api_key is not None
    assert loaded.tinker_api_key.get_secret_value() == TINKER_KEY
    shown = asyncio.run(read_redacted("whitney-tinker"))
    assert shown["tinker_base_url"] == TINKER_URL
    assert TINKER_KEY not in json.dumps(shown, default=str)

    argv = ["serve", "--port", "0", "--tinker-block", "whitney-tinker"]
    assert tinker_block.tinker_serve_arguments(argv) == [
        "serve",
        "--port",
        "0",
        "--tinker-url",
        TINKER_URL,
    ]
    assert os.environ[tinker_block.TINKER_KEY_ENV] == TINKER_KEY

    WhitneyCredentials(base_url="http://127.0.0.1:1", api_key=KEY).save("no-tinker", overwrite=True)
    for argv, message in (
        (["serve", "--tinker-block", "no-tinker"], "block 'no-tinker' has no tinker_base_url"),
        (["serve", "--tinker-block=nosuch"], "python -m blocks save nosuch"),
        (["serve", "--tinker-block", "whitney-tinker", "--tinker-url", TINKER_URL], "not both"),
        (["serve", "--tinker-block"], "expected a WhitneyCredentials block name"),
    ):
        with pytest.raises(ConfigError, match=message) as error:
            tinker_block.tinker_serve_arguments(argv)
        assert error.value.field == "--tinker-block"


def test_serve_refuses_a_block_without_tinker_in_one_line(
    prefect_server: None, clean_tinker_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    WhitneyCredentials(base_url="http://127.0.0.1:1", api_key=KEY).save("no-tinker", overwrite=True)
    assert run_command(["serve", "--tinker-block", "no-tinker"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "whitney-flows serve: --tinker-block: block 'no-tinker' has no tinker_base_url"
    ]
