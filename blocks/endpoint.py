"""Which Whitney to talk to, decided in one place for the flows, their cleanup hooks and every
`whitney-flows` command:

1. `whitney_block` names a saved `WhitneyCredentials` block: its URL, key and client settings
   (a missing block is an error naming it, never a fall-through);
2. else `api_url`, else WHITNEY_API_URL, with the key from WHITNEY_API_KEY (a URL without a
   key is an error naming where the URL came from);
3. else None: nothing names a Whitney, and the caller falls back on the embedded server
   (`whitney-flows run` starts one, `inspect` reads its data directory; a flow run refuses).

No Prefect import unless a block is named: `inspect`, `runs` and `export` start fast. The key
stays a `SecretStr` and is in no message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import SecretStr

from blocks.connection import WhitneyConnection
from flows.core.config import ConfigError
from whitney.client import API_KEY_ENV, API_URL_ENV

if TYPE_CHECKING:
    from blocks import WhitneyCredentials

BLOCK_FIELD = "whitney_block"
"""The flow parameter that names a credentials block."""


@dataclass(frozen=True)
class Endpoint:
    """A resolved Whitney, and what named it (`whitney_block`, the URL's parameter or
    WHITNEY_API_URL): the name an error about it points at."""

    connection: WhitneyConnection
    named_by: str


def resolve_endpoint(
    api_url: str | None, whitney_block: str | None = None, *, url_field: str = "api_url"
) -> Endpoint | None:
    """The Whitney of `whitney_block`, else of `api_url` (named `url_field` in errors), else
    of WHITNEY_API_URL; None when none is set. ConfigError naming what to fix."""
    if whitney_block:
        block = load_block(whitney_block)  # the connection takes its fields of the same names
        connection = WhitneyConnection.model_validate(block, from_attributes=True)
        return Endpoint(connection, BLOCK_FIELD)
    named_by = url_field if api_url else API_URL_ENV
    url = api_url or os.environ.get(API_URL_ENV)
    if not url:
        return None
    key = os.environ.get(API_KEY_ENV)
    if not key:
        raise ConfigError(named_by, f"reading {url} needs {API_KEY_ENV}")
    return Endpoint(WhitneyConnection(base_url=url.rstrip("/"), api_key=SecretStr(key)), named_by)


def load_block(name: str) -> WhitneyCredentials:
    """The saved `WhitneyCredentials` block `name`; ConfigError naming `whitney_block` (and
    how to create the block) if it cannot be loaded."""
    from blocks import load_credentials

    try:
        return load_credentials(name)
    except ValueError as error:
        raise ConfigError(BLOCK_FIELD, str(error)) from None
