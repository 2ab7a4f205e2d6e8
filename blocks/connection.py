"""How a task reaches Whitney: a small picklable connection, and one client per connection
per process; and the client settings, defined once here for the connection and for the
`WhitneyCredentials` block it is built from.

Tasks take a `WhitneyConnection` instead of a live client, so they can be shipped to another
process (a Dask worker, say). The API key is a `SecretStr`: it shows as `**********` in every
repr and JSON dump, and is revealed only to build the client.
"""

from __future__ import annotations

import threading
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from whitney.client import WhitneyClient

TimeoutS = Annotated[
    float,
    Field(
        default=30.0,
        gt=0,
        le=3600,
        title="Request timeout (s)",
        description="Bound of one HTTP request",
    ),
]
MaxAttempts = Annotated[
    int,
    Field(
        default=6, ge=1, le=100, title="Max attempts", description="HTTP attempts per client call"
    ),
]
MaxRetrySeconds = Annotated[
    float,
    Field(
        default=120.0,
        ge=0,
        le=86_400,
        title="Max retry time (s)",
        description="Bound of the client's retries of one call",
    ),
]
BackoffBaseS = Annotated[
    float,
    Field(
        default=0.2,
        ge=0,
        le=600,
        title="Backoff base (s)",
        description="First delay of the client's full-jitter exponential backoff",
    ),
]
BackoffMaxS = Annotated[
    float,
    Field(
        default=10.0, ge=0, le=3600, title="Backoff cap (s)", description="Cap of one retry delay"
    ),
]
PollWaitS = Annotated[
    float,
    Field(
        default=30.0,
        ge=0,
        le=60,
        title="Long-poll wait (s)",
        description="How long each long-poll GET of an operation asks the server to wait",
    ),
]


class ClientFactory(BaseModel):
    """`client_settings()` and `get_client()` for a model with `base_url`, `api_key` (a
    `SecretStr`) and the client settings above, declared here once: the connection and the
    block."""

    base_url: str
    api_key: SecretStr
    timeout_s: TimeoutS
    max_attempts: MaxAttempts
    max_retry_seconds: MaxRetrySeconds
    backoff_base_s: BackoffBaseS
    backoff_max_s: BackoffMaxS
    poll_wait_s: PollWaitS

    def client_settings(self) -> dict[str, float | int]:
        """The `WhitneyClient` keyword arguments these settings stand for (no URL, no key)."""
        return {
            "timeout": self.timeout_s,
            "max_attempts": self.max_attempts,
            "max_retry_seconds": self.max_retry_seconds,
            "backoff_base": self.backoff_base_s,
            "backoff_max": self.backoff_max_s,
            "poll_wait_s": self.poll_wait_s,
        }

    def get_client(self) -> WhitneyClient:
        """A new client for this endpoint, to use in a `with` and close: the way in for code
        outside a task (the CLI, the cleanup hooks, the reaper). Tasks share one: `client_for`."""
        return WhitneyClient(
            self.base_url, self.api_key.get_secret_value(), **self.client_settings()
        )


class WhitneyConnection(ClientFactory):
    """Where Whitney is, the key to it, and how patient the client is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(description="Whitney base URL, e.g. http://127.0.0.1:8765")
    api_key: SecretStr = Field(description="Whitney API key (never shown)")


_clients: dict[WhitneyConnection, WhitneyClient] = {}
_clients_lock = threading.Lock()


def client_for(connection: WhitneyConnection) -> WhitneyClient:
    """The process-wide client of this connection, created on first use (thread-safe); the
    tasks' alone (`tests/sdk/test_flow_layering.py` checks that only `tasks/` calls it)."""
    with _clients_lock:
        client = _clients.get(connection)
        if client is None:
            client = connection.get_client()
            _clients[connection] = client
        return client
