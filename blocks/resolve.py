"""Which Whitney a flow run talks to: a `WhitneyCredentials` block, else the environment, else
an embedded server.

    endpoint = resolve_whitney(whitney_block, api_url=config.api_url)
    if endpoint is None:  # nothing configured: the caller starts an embedded server
        ...

or, starting the embedded server itself when nothing is configured:

    with whitney_endpoint(whitney_block, api_url=config.api_url) as endpoint:
        connection = WhitneyConnection(**endpoint.connection_fields())

Resolution order:

1. `whitney_block` names a saved `WhitneyCredentials` block: its URL, key and settings
   (a missing block is an error, never a silent fall-through);
2. `api_url` or `WHITNEY_API_URL`, with the key from `WHITNEY_API_KEY`;
3. neither: the embedded server (`whitney.local.EmbeddedWhitney`) on a free loopback port.

The key stays a `SecretStr` from end to end; `describe()` is safe to log.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from blocks.credentials import ClientFactory, Provider, WhitneyCredentials
from whitney.client import API_KEY_ENV, API_URL_ENV

Source = Literal["block", "environment", "embedded"]


class BlockNotFound(ValueError):
    """The named `WhitneyCredentials` block does not exist on the Prefect server."""


class WhitneyEndpoint(ClientFactory, BaseModel):
    """A resolved Whitney endpoint: URL, key (never shown), client settings, and where they
    came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str
    api_key: SecretStr
    source: Source
    block_name: str | None = None
    default_provider: Provider | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    max_attempts: int = Field(default=6, ge=1)
    max_retry_seconds: float = Field(default=120.0, ge=0)
    backoff_base_s: float = Field(default=0.2, ge=0)
    backoff_max_s: float = Field(default=10.0, ge=0)
    poll_wait_s: float = Field(default=30.0, ge=0, le=60)
    price_table: dict[str, float] | None = None

    @classmethod
    def from_block(cls, block: WhitneyCredentials, name: str | None = None) -> WhitneyEndpoint:
        return cls(
            base_url=block.base_url,
            api_key=block.api_key,
            source="block",
            block_name=name,
            default_provider=block.default_provider,
            timeout_s=block.timeout_s,
            max_attempts=block.max_attempts,
            max_retry_seconds=block.max_retry_seconds,
            backoff_base_s=block.backoff_base_s,
            backoff_max_s=block.backoff_max_s,
            poll_wait_s=block.poll_wait_s,
            price_table=block.price_table,
        )

    def connection_fields(self) -> dict[str, Any]:
        """The fields of `tasks.connection.WhitneyConnection` (the key stays a SecretStr)."""
        return {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "timeout_s": self.timeout_s,
            "max_attempts": self.max_attempts,
            "max_retry_seconds": self.max_retry_seconds,
            "poll_wait_s": self.poll_wait_s,
        }

    def provider_for(self, requested: str, explicitly_set: bool) -> str:
        """The provider a run uses: the config's when it set one, else the block's default."""
        if explicitly_set or self.default_provider is None:
            return requested
        return self.default_provider

    def describe(self) -> str:
        """One line for logs: where, and from what; never the key."""
        if self.source == "block":
            return f"Whitney at {self.base_url} (block {self.block_name!r})"
        if self.source == "environment":
            return f"Whitney at {self.base_url} (from {API_URL_ENV}/{API_KEY_ENV})"
        return f"Whitney at {self.base_url} (embedded server)"


def load_credentials(name: str) -> WhitneyCredentials:
    """The saved `WhitneyCredentials` block `name`; BlockNotFound saying how to create it."""
    try:
        return WhitneyCredentials.load(name, _sync=True)
    except ValueError as error:
        if "Unable to find block document" not in str(error):
            raise
        raise BlockNotFound(
            f"no WhitneyCredentials block named {name!r} on this Prefect server: create it "
            f"with `python -m blocks save {name} --base-url URL` (key from {API_KEY_ENV})"
        ) from None


def resolve_whitney(
    whitney_block: str | None = None, api_url: str | None = None
) -> WhitneyEndpoint | None:
    """The configured endpoint (block, then the environment), or None when nothing is
    configured and the caller should start an embedded server.

    ValueError naming what is missing when a URL is configured but no key is."""
    if whitney_block:
        return WhitneyEndpoint.from_block(load_credentials(whitney_block), whitney_block)
    url = api_url or os.environ.get(API_URL_ENV) or None
    if url is None:
        return None
    key = os.environ.get(API_KEY_ENV) or None
    if key is None:
        raise ValueError(f"Whitney URL {url} is configured but {API_KEY_ENV} is not set")
    return WhitneyEndpoint(base_url=url.rstrip("/"), api_key=SecretStr(key), source="environment")


@contextmanager
def whitney_endpoint(
    whitney_block: str | None = None,
    api_url: str | None = None,
    *,
    data_dir: str | Path | None = None,
) -> Iterator[WhitneyEndpoint]:
    """`resolve_whitney`, and when nothing is configured an embedded server for the duration
    of the block (its journal under `data_dir`, else a temporary directory)."""
    endpoint = resolve_whitney(whitney_block, api_url)
    if endpoint is not None:
        yield endpoint
        return
    from whitney.local import EmbeddedWhitney

    with EmbeddedWhitney(data_dir) as server:
        yield WhitneyEndpoint(
            base_url=server.url, api_key=SecretStr(server.api_key), source="embedded"
        )
