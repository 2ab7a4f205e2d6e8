"""Which Whitney a flow talks to: the `whitney_block` WhitneyCredentials block if the flow run
names one, else the config's `api_url` (else WHITNEY_API_URL) and the key from
WHITNEY_API_KEY. Resolved from parameters and the environment only, so a hook in another
process (a runner or worker) resolves the same one.

`check_whitney` is the CLI's fail-fast probe of a URL and key, before any flow run starts.
"""

from __future__ import annotations

import os

from prefect.context import FlowRunContext

from blocks import resolve_whitney
from flows.core.config import ConfigError
from tasks.connection import WhitneyConnection
from whitney.client import API_KEY_ENV, WhitneyClient
from whitney.errors import TransportError, Unauthorized, WhitneyError

EMBEDDED_URL_ENV = "WHITNEY_FLOWS_EMBEDDED_URL"
"""Set by `whitney-flows run` to the URL of the embedded server it started for the flow."""
PROBE_TIMEOUT_S = 2.0
"""How long `check_whitney` waits for the capabilities answer (one attempt)."""


def resolve_connection(api_url: str | None, whitney_block: str | None = None) -> WhitneyConnection:
    """The connection of the block `whitney_block` if given, else for `api_url`;
    ConfigError naming the parameter if the block, URL or key is missing."""
    if whitney_block:
        try:
            endpoint = resolve_whitney(whitney_block)
        except ValueError as error:
            raise ConfigError("whitney_block", str(error)) from None
        return WhitneyConnection(**endpoint.connection_fields())
    try:
        return WhitneyConnection.from_env(api_url)
    except ValueError as error:
        raise ConfigError("api_url", str(error)) from None


def check_whitney(url: str, url_field: str) -> None:
    """ConfigError naming `url_field` (where the URL came from) if nothing at `url` answers
    like Whitney within PROBE_TIMEOUT_S, or naming WHITNEY_API_KEY if it refuses the key.
    Busy answers (429, 5xx) pass: the flow's retries wait for those."""
    key = os.environ.get(API_KEY_ENV, "")
    try:
        with WhitneyClient(url, key, timeout=PROBE_TIMEOUT_S, max_attempts=1) as client:
            client.capabilities()
    except Unauthorized as error:
        raise ConfigError(API_KEY_ENV, f"{url} refused the key ({error})") from None
    except TransportError as error:
        reason = error.message.split(": ", 1)[-1]  # "GET <path>: <exception>: <detail>"
        raise ConfigError(url_field, f"no Whitney answers at {url} ({reason})") from None
    except WhitneyError as error:
        if not error.retryable:
            raise ConfigError(url_field, f"{url} does not answer as Whitney ({error})") from None
    except ValueError as error:  # not an http(s) URL (check_api_key saw to the key)
        raise ConfigError(url_field, str(error)) from None


def flow_run_api_url() -> str | None:
    """The Whitney URL of the current flow run (from its parameters, like the cleanup
    hooks); None outside a flow run or on the embedded server `whitney-flows run` started."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return None
    parameters = context.flow_run.parameters
    config = parameters.get("config") or {}
    url = resolve_connection(config.get("api_url"), parameters.get("whitney_block")).base_url
    return None if url == os.environ.get(EMBEDDED_URL_ENV) else url
