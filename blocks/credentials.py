"""`WhitneyCredentials`: where a Whitney endpoint is, the key to it, and how patient the client
is, saved once on the Prefect server and loaded by name by every flow run.

The API key is a `SecretStr`: the Prefect UI and API show it as `**********`, `repr` and
`model_dump` never reveal it, and it is revealed only to build a `WhitneyClient`.
"""

from __future__ import annotations

from collections.abc import Mapping

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator, model_validator

from blocks.connection import ClientFactory
from whitney import wire
from whitney.client import API_KEY_ENV

OPERATION_KINDS: frozenset[str] = wire.RUN_OPERATION_KINDS | wire.SAMPLER_OPERATION_KINDS
"""The keys a price table may have: every Whitney operation kind."""


class WhitneyCredentials(ClientFactory, Block):
    """Credentials and connection settings of a Whitney training API endpoint: the hosted
    service or an embedded server (`whitney-flows serve`). Flows load it by name through
    their `whitney_block` parameter."""

    _block_type_name = "Whitney Credentials"
    _block_type_slug = "whitney-credentials"
    _logo_url = None
    _description = (
        "Base URL, API key and client settings of a Whitney training API endpoint "
        "(the hosted service, or an embedded server started by `whitney-flows serve`)."
    )
    _code_example = """
```python
from blocks import WhitneyCredentials

credentials = WhitneyCredentials.load("whitney")
with credentials.get_client() as client:
    print(client.capabilities())
```
"""

    base_url: str = Field(
        default=...,
        title="Base URL",
        description="Whitney base URL, e.g. http://127.0.0.1:8765 for an embedded server",
        pattern=r"^https?://\S+$",
    )
    api_key: SecretStr = Field(
        default=...,
        title="API key",
        description="Whitney API key; stored encrypted, shown as ********** everywhere",
    )
    price_table: dict[str, float] | None = Field(
        default=None,
        title="Price table",
        description="Optional: USD per 1,000 billed tokens by operation kind, e.g. "
        '{"sample": 0.0002, "forward_backward": 0.0006}; used to estimate a run\'s cost',
    )

    tinker_base_url: str | None = Field(
        default=None,
        title="Tinker base URL",
        description="Optional: the Tinker endpoint (Tinker's URL or a Tinker-compatible server) "
        "that `whitney-flows serve --tinker-block NAME` forwards provider tinker runs to",
        pattern=r"^https?://\S+$",
    )
    tinker_api_key: SecretStr | None = Field(
        default=None,
        title="Tinker API key",
        description="Optional: the Tinker API key of that endpoint; stored encrypted, shown as "
        "********** everywhere, given to the server in its environment only",
    )

    @field_validator("base_url", "tinker_base_url")
    @classmethod
    def _strip_slash(cls, value: str | None) -> str | None:
        return None if value is None else value.rstrip("/")

    @field_validator("api_key")
    @classmethod
    def _non_empty_key(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("api_key must not be empty")
        return value

    @model_validator(mode="after")
    def _tinker_key_needs_url(self) -> WhitneyCredentials:
        if self.tinker_api_key is not None and self.tinker_base_url is None:
            raise ValueError("tinker_api_key: give tinker_base_url too (the endpoint it is for)")
        return self

    @field_validator("price_table")
    @classmethod
    def _known_kinds(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        unknown = sorted(set(value) - OPERATION_KINDS)
        if unknown:
            raise ValueError(
                f"unknown operation kind(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(OPERATION_KINDS))})"
            )
        negative = sorted(kind for kind, price in value.items() if not price >= 0)
        if negative:
            raise ValueError(f"prices must be >= 0: {', '.join(negative)}")
        return dict(value)

    def estimate_cost(self, tokens_by_kind: Mapping[str, int | float]) -> float | None:
        """USD for the billed tokens per operation kind, from the price table; None without
        one. A kind the table does not price costs nothing."""
        if self.price_table is None:
            return None
        return sum(
            self.price_table.get(kind, 0.0) * tokens / 1000.0
            for kind, tokens in tokens_by_kind.items()
        )


class BlockNotFound(ValueError):
    """The named `WhitneyCredentials` block does not exist on the Prefect server."""


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
