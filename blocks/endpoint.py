"""Which Whitney to talk to, decided in one place for the flows, their cleanup hooks and every
`whitney-flows` command:

1. `whitney_block` names a saved `WhitneyCredentials` block: its URL, key and client settings
   (a missing block is an error naming it, never a fall-through);
2. else `api_url`, else WHITNEY_API_URL, with the key from WHITNEY_API_KEY (a URL without a
   key is an error naming where the URL came from);
3. else None: nothing names a Whitney, and the caller falls back on the embedded server
   (`whitney-flows run` starts one, `inspect` reads its data directory; a flow run refuses).

A flow run's connection (`resolve_connection`) comes from its parameters and the environment
only, so a hook in another process (a runner or worker) resolves the same one. `check_whitney`
is the CLI's fail-fast probe of an endpoint, before any flow run starts; `check_served` checks
that the provider serves a flow's base models (the capabilities document lists them), by the
CLI (exit 2) and by every flow run, before a session opens.

No Prefect import unless a block is named or a flow run asks: `inspect`, `runs` and `export`
start fast. The key stays a `SecretStr` and is in no message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import SecretStr

from blocks.connection import WhitneyConnection
from flows.core.config import ConfigError, FlowConfig
from whitney import wire
from whitney.client import API_KEY_ENV, API_URL_ENV
from whitney.errors import TransportError, Unauthorized, WhitneyError
from whitney.tokenizers import HF_PREFIX

if TYPE_CHECKING:
    from blocks import WhitneyCredentials

BLOCK_FIELD = "whitney_block"
"""The flow parameter that names a credentials block."""
EMBEDDED_URL_ENV = "WHITNEY_FLOWS_EMBEDDED_URL"
"""Set by `whitney-flows run` to the URL of the embedded server it started for the flow."""
EMBEDDED_DATA_DIR_ENV = "WHITNEY_FLOWS_EMBEDDED_DATA_DIR"
"""Set by `whitney-flows run` to that server's data directory when it is not the default one
(another live server held the default)."""
PROBE_TIMEOUT_S = 2.0
"""How long `check_whitney` waits for the capabilities answer (one attempt)."""


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


def resolve_connection(api_url: str | None, whitney_block: str | None = None) -> WhitneyConnection:
    """The connection of the block `whitney_block` if given, else for `api_url`;
    ConfigError naming the parameter if the block, URL or key is missing (a flow run starts
    no embedded server)."""
    endpoint = resolve_endpoint(api_url, whitney_block)
    if endpoint is None:
        raise ConfigError("api_url", f"no Whitney URL: give api_url or set {API_URL_ENV}")
    return endpoint.connection


def check_whitney(endpoint: Endpoint) -> wire.Capabilities | None:
    """The endpoint's capabilities; ConfigError naming what named the endpoint if nothing
    there answers like Whitney within PROBE_TIMEOUT_S, or naming WHITNEY_API_KEY if it refuses
    the key. Busy answers (429, 5xx) pass, with None: the flow's retries wait for those."""
    url, field = endpoint.connection.base_url, endpoint.named_by
    probe = endpoint.connection.model_copy(update={"timeout_s": PROBE_TIMEOUT_S, "max_attempts": 1})
    try:
        with probe.get_client() as client:
            return client.capabilities()
    except Unauthorized as error:
        raise ConfigError(API_KEY_ENV, f"{url} refused the key ({error})") from None
    except TransportError as error:
        reason = error.message.split(": ", 1)[-1]  # "GET <path>: <exception>: <detail>"
        raise ConfigError(field, f"no Whitney answers at {url} ({reason})") from None
    except WhitneyError as error:
        if not error.retryable:
            raise ConfigError(field, f"{url} does not answer as Whitney ({error})") from None
    except ValueError as error:  # not an http(s) URL (resolve_endpoint saw to the key)
        raise ConfigError(field, str(error)) from None
    return None


def flow_run_api_url() -> str | None:
    """The Whitney URL of the current flow run (from its parameters, like the cleanup
    hooks); None outside a flow run or on the embedded server `whitney-flows run` started."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return None
    parameters = context.flow_run.parameters
    config = parameters.get("config") or {}
    url = resolve_connection(config.get("api_url"), parameters.get("whitney_block")).base_url
    return None if url == os.environ.get(EMBEDDED_URL_ENV) else url


def check_served(config: FlowConfig, capabilities: wire.Capabilities) -> None:
    """ConfigError naming the field of a base model `config.provider` does not list. An
    `hf:` name passes: the embedded server serves those unlisted and answers them itself."""
    provider = capabilities.providers.get(config.provider)
    if provider is None:
        offered = ", ".join(sorted(capabilities.providers))
        raise ConfigError("provider", f"{config.provider} is not offered here (offered: {offered})")
    for field, base_model in config.served_models().items():
        if base_model.startswith(HF_PREFIX) or base_model in provider.base_models:
            continue
        raise ConfigError(
            field,
            f"{base_model!r} is not a base model of provider {config.provider} here; it "
            f"serves: {', '.join(provider.base_models)}",
        )
