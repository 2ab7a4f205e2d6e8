"""A flow config as a tracker's params: flattened to dotted names and strings, with nothing
secret. No Prefect.

A config holds no API key (flows.core.config), but a URL may carry credentials
(`https://user:token@host`) and a plug-in's settings may name a secret: URL credentials are
cut out, and a setting whose name says it is secret is left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

MAX_VALUE_CHARS = 6000
"""MLflow's limit on a param's value."""
SECRET_NAME = re.compile(r"(api_?key|secret|password|passwd|credential|auth|token$)", re.I)
"""A setting named like this is never sent (`token`, not `max_tokens`)."""
URL_CREDENTIALS = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s]+@", re.I)


def without_credentials(value: str) -> str:
    """`value`, with the user and password of a URL cut out."""
    if not URL_CREDENTIALS.match(value):
        return value
    parts = urlsplit(value)
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=host))


def flattened(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted name, leaf) of a JSON value: tables open into dotted names; lists are leaves."""
    if isinstance(value, Mapping) and value:
        for name, inner in value.items():
            yield from flattened(inner, f"{prefix}.{name}" if prefix else str(name))
    else:
        yield prefix, value


def text(value: Any) -> str:
    """A leaf as a param's value: strings as they are, anything else as JSON."""
    written = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return without_credentials(written)[:MAX_VALUE_CHARS]


def config_params(config: BaseModel) -> dict[str, str]:
    """The config's settings by dotted name (`task_retry.retries`), as strings, secrets out."""
    return {
        name: text(value)
        for name, value in flattened(config.model_dump(mode="json"))
        if not any(SECRET_NAME.search(part) for part in name.split("."))
    }
