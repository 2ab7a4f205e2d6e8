"""A flow config as a tracker's params, and every value a tracker gets, with nothing secret:
flattened to dotted names and strings. No Prefect.

A config holds no API key (flows.core.config), but a URL may carry credentials
(`https://user:token@host`) anywhere in a value (a list, a table, a sentence) and a
plug-in's settings may name a secret: every URL's credentials are cut out, and a setting
whose name says it is secret is left out, at any depth.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel

MAX_VALUE_CHARS = 6000
"""MLflow's limit on a param's value."""
SECRET_NAME = re.compile(r"(api_?key|secret|password|passwd|credential|auth|token$)", re.I)
"""A setting named like this is never sent (`token`, not `max_tokens`)."""
URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^\s/?#\"'<>]*@", re.I)
"""A URL's scheme and its user-information part, up to the last `@` of its authority."""


def without_credentials(value: str) -> str:
    """`value`, with the user and password of every URL in it cut out."""
    return URL_CREDENTIALS.sub(r"\g<scheme>", value)


def redacted(value: Any) -> Any:
    """A JSON value with nothing secret at any depth: secret-named settings of every table
    left out, every string without URL credentials."""
    if isinstance(value, Mapping):
        return {
            name: redacted(inner)
            for name, inner in value.items()
            if not SECRET_NAME.search(str(name))
        }
    if isinstance(value, list | tuple):
        return [redacted(inner) for inner in value]
    if isinstance(value, str):
        return without_credentials(value)
    return value


def flattened(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted name, leaf) of a JSON value: tables open into dotted names; lists are leaves."""
    if isinstance(value, Mapping) and value:
        for name, inner in value.items():
            yield from flattened(inner, f"{prefix}.{name}" if prefix else str(name))
    else:
        yield prefix, value


def text(value: Any) -> str:
    """A value as a tracker's string, redacted: strings as they are, anything else as JSON."""
    clean = redacted(value)
    written = clean if isinstance(clean, str) else json.dumps(clean, sort_keys=True)
    return written[:MAX_VALUE_CHARS]


def config_params(config: BaseModel) -> dict[str, str]:
    """The config's settings by dotted name (`task_retry.retries`), as strings, secrets out."""
    return {
        name: text(value) for name, value in flattened(redacted(config.model_dump(mode="json")))
    }
