"""How a task reaches Whitney: a small picklable connection, and one client per connection
per process.

Tasks take a `WhitneyConnection` instead of a live client, so they can be shipped to another
process (a Dask worker, say). The API key is a `SecretStr`: it shows as `**********` in every
repr and JSON dump, and is revealed only to build the client.
"""

from __future__ import annotations

import os
import threading

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from whitney.client import API_KEY_ENV, API_URL_ENV, WhitneyClient


class WhitneyConnection(BaseModel):
    """Where Whitney is, the key to it, and how patient the client is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(description="Whitney base URL, e.g. http://127.0.0.1:8765")
    api_key: SecretStr = Field(description="Whitney API key (never shown)")
    timeout_s: float = Field(default=30.0, gt=0, description="Bound of one HTTP request")
    max_attempts: int = Field(default=6, ge=1, description="HTTP attempts per call")
    max_retry_seconds: float = Field(
        default=120.0, ge=0, description="Bound of the client's retries of one call"
    )
    poll_wait_s: float = Field(
        default=30.0, ge=0, le=60, description="Long-poll wait of one operation GET"
    )

    @classmethod
    def from_env(cls, base_url: str | None = None) -> WhitneyConnection:
        """`base_url` (else WHITNEY_API_URL) with the key from WHITNEY_API_KEY.

        ValueError naming the missing variable when either is absent.
        """
        url = base_url or os.environ.get(API_URL_ENV)
        if not url:
            raise ValueError(f"no Whitney URL: give api_url or set {API_URL_ENV}")
        key = os.environ.get(API_KEY_ENV)
        if not key:
            raise ValueError(f"no Whitney API key: set {API_KEY_ENV}")
        return cls(base_url=url, api_key=SecretStr(key))


_clients: dict[WhitneyConnection, WhitneyClient] = {}
_clients_lock = threading.Lock()


def client_for(connection: WhitneyConnection) -> WhitneyClient:
    """The process-wide client of this connection, created on first use (thread-safe)."""
    with _clients_lock:
        client = _clients.get(connection)
        if client is None:
            client = WhitneyClient(
                connection.base_url,
                connection.api_key.get_secret_value(),
                timeout=connection.timeout_s,
                max_attempts=connection.max_attempts,
                max_retry_seconds=connection.max_retry_seconds,
                poll_wait_s=connection.poll_wait_s,
            )
            _clients[connection] = client
        return client
