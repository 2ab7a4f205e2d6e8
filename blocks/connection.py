"""How a task reaches Whitney: a small picklable connection, and one client per connection
per process.

Tasks take a `WhitneyConnection` instead of a live client, so they can be shipped to another
process (a Dask worker, say). The API key is a `SecretStr`: it shows as `**********` in every
repr and JSON dump, and is revealed only to build the client.
"""

from __future__ import annotations

import threading

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from whitney.client import WhitneyClient


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
    backoff_base_s: float = Field(
        default=0.2, ge=0, description="First delay of the client's full-jitter backoff"
    )
    backoff_max_s: float = Field(default=10.0, ge=0, description="Cap of one retry delay")
    poll_wait_s: float = Field(
        default=30.0, ge=0, le=60, description="Long-poll wait of one operation GET"
    )

    def new_client(self) -> WhitneyClient:
        """A new client for this connection, to use in a `with` and close: the way in for code
        outside a task (the CLI, the cleanup hooks, the reaper). Tasks share one: `client_for`."""
        return WhitneyClient(
            self.base_url,
            self.api_key.get_secret_value(),
            timeout=self.timeout_s,
            max_attempts=self.max_attempts,
            max_retry_seconds=self.max_retry_seconds,
            backoff_base=self.backoff_base_s,
            backoff_max=self.backoff_max_s,
            poll_wait_s=self.poll_wait_s,
        )


_clients: dict[WhitneyConnection, WhitneyClient] = {}
_clients_lock = threading.Lock()


def client_for(connection: WhitneyConnection) -> WhitneyClient:
    """The process-wide client of this connection, created on first use (thread-safe); the
    tasks' alone (`tests/sdk/test_flow_layering.py` checks that only `tasks/` calls it)."""
    with _clients_lock:
        client = _clients.get(connection)
        if client is None:
            client = connection.new_client()
            _clients[connection] = client
        return client
