"""Which Whitney a flow talks to: the `whitney_block` WhitneyCredentials block if the flow run
names one, else the config's `api_url` (else WHITNEY_API_URL) and the key from
WHITNEY_API_KEY. Resolved from parameters and the environment only, so a hook in another
process (a runner or worker) resolves the same one."""

from __future__ import annotations

from blocks import resolve_whitney
from flows.config import ConfigError
from tasks.connection import WhitneyConnection


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
