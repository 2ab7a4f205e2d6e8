"""`whitney-flows serve --tinker-block NAME`: the Tinker endpoint and key of a saved
`WhitneyCredentials` block, as `--tinker-url URL` and TINKER_API_KEY in the server's own
environment (never on a command line)."""

from __future__ import annotations

import os

from flows.core.config import ConfigError

FLAG = "--tinker-block"
TINKER_KEY_ENV = "TINKER_API_KEY"


def names_block(arguments: list[str]) -> bool:
    """Whether serve's `arguments` name a Tinker block."""
    return any(arg == FLAG or arg.startswith(f"{FLAG}=") for arg in arguments)


def tinker_serve_arguments(arguments: list[str]) -> list[str]:
    """Serve's `arguments` with `--tinker-block NAME` as `--tinker-url` of the block, whose key
    (if it has one) goes in TINKER_API_KEY; ConfigError naming the flag otherwise."""
    from blocks import BlockNotFound, load_credentials

    if "--tinker-url" in arguments or any(a.startswith("--tinker-url=") for a in arguments):
        raise ConfigError(FLAG, "give --tinker-block or --tinker-url, not both")
    rest, name = [], None
    items = iter(arguments)
    for arg in items:
        if arg == FLAG:
            name = next(items, None)
        elif arg.startswith(f"{FLAG}="):
            name = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if not name:
        raise ConfigError(FLAG, "expected a WhitneyCredentials block name")
    try:
        block = load_credentials(name)
    except BlockNotFound as error:
        raise ConfigError(FLAG, str(error)) from None
    if block.tinker_base_url is None:
        raise ConfigError(FLAG, f"block {name!r} has no tinker_base_url")
    if block.tinker_api_key is not None:
        os.environ[TINKER_KEY_ENV] = block.tinker_api_key.get_secret_value()
    return [*rest, "--tinker-url", block.tinker_base_url]
