"""The connection of a flow run (its `whitney_block` parameter, else its config's `api_url`,
as `blocks.endpoint` resolves them), from parameters and the environment only, so a hook
in another process (a runner or worker) resolves the same one.

`check_whitney` is the CLI's fail-fast probe of an endpoint, before any flow run starts.
"""

from __future__ import annotations

import os

from prefect.context import FlowRunContext

from blocks.connection import WhitneyConnection
from blocks.endpoint import Endpoint, resolve_endpoint
from flows.core.config import ConfigError
from flows.core.records.summary_parts import export_command
from whitney import wire
from whitney.client import API_KEY_ENV, API_URL_ENV
from whitney.errors import TransportError, Unauthorized, WhitneyError

EMBEDDED_URL_ENV = "WHITNEY_FLOWS_EMBEDDED_URL"
"""Set by `whitney-flows run` to the URL of the embedded server it started for the flow."""
EMBEDDED_DATA_DIR_ENV = "WHITNEY_FLOWS_EMBEDDED_DATA_DIR"
"""Set by `whitney-flows run` to that server's data directory when it is not the default one
(another live server held the default)."""
PROBE_TIMEOUT_S = 2.0
"""How long `check_whitney` waits for the capabilities answer (one attempt)."""


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
        with probe.new_client() as client:
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
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return None
    parameters = context.flow_run.parameters
    config = parameters.get("config") or {}
    url = resolve_connection(config.get("api_url"), parameters.get("whitney_block")).base_url
    return None if url == os.environ.get(EMBEDDED_URL_ENV) else url


def flow_run_export_command(run_id: str) -> str:
    """The command that exports the current flow run's adapter of `run_id`: with the URL of
    its Whitney, or the data directory of `whitney-flows run`'s embedded server if not the
    default one."""
    api_url = flow_run_api_url()
    return export_command(run_id, api_url, os.environ.get(EMBEDDED_DATA_DIR_ENV))
