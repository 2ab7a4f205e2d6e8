"""The `whitney://` URI grammar of checkpoints, in one place: `save_state` writes
`whitney://runs/<run_id>/states/<name>`; `load_state`, `create_run(from_checkpoint=...)` and the
flows read it. A run's sampler is `whitney://runs/<run_id>/samplers/<sampler_id>` (a `model` of
the OpenAI-compatible routes, docs/openai.md)."""

from __future__ import annotations

import re

RUN_ID = r"[A-Za-z0-9_-]+"
STATE_NAME = r"[A-Za-z0-9._-]+"
_PARTS = re.compile(rf"^whitney://runs/(?P<run_id>{RUN_ID})/states/(?P<name>[^/]+)$")
_SAMPLER_PARTS = re.compile(rf"^whitney://runs/(?P<run_id>{RUN_ID})/samplers/(?P<name>[^/]+)$")


def checkpoint_pattern(name: str = STATE_NAME) -> str:
    """The regex of the checkpoint URIs whose state name matches `name`, without groups (as a
    JSON Schema `pattern`, which a browser's regex engine checks too)."""
    return rf"^whitney://runs/{RUN_ID}/states/{name}$"


CHECKPOINT_PATTERN = checkpoint_pattern()
"""What a config field naming any checkpoint must match."""


def checkpoint_regex(name: str) -> re.Pattern[str]:
    """The checkpoint URIs whose state name matches `name`, the run id in group `run_id`."""
    return re.compile(rf"^whitney://runs/(?P<run_id>{RUN_ID})/states/{name}$")


def checkpoint_uri(run_id: str, name: str) -> str:
    """The URI of the state `name` that run `run_id` saved."""
    return f"whitney://runs/{run_id}/states/{name}"


def split_checkpoint(uri: str) -> tuple[str, str] | None:
    """(run id, state name) of a URI of the checkpoint shape (the name not yet checked: the
    server refuses an invalid one with its own message); None for any other string."""
    match = _PARTS.match(uri)
    return None if match is None else (match["run_id"], match["name"])


def checkpoint_run_id(uri: str) -> str:
    """The run that saved the checkpoint `uri`; ValueError if `uri` is not a checkpoint URI."""
    parts = split_checkpoint(uri)
    if parts is None or re.match(CHECKPOINT_PATTERN, uri) is None:
        raise ValueError(f"not a checkpoint: {uri!r} (expected whitney://runs/<run>/states/<name>)")
    return parts[0]


def sampler_uri(run_id: str, sampler_id: str) -> str:
    """The URI of the sampler `sampler_id` that run `run_id` saved."""
    return f"whitney://runs/{run_id}/samplers/{sampler_id}"


def split_sampler(uri: str) -> tuple[str, str] | None:
    """(run id, sampler id) of a URI of the sampler shape (the id not yet checked); None for
    any other string."""
    match = _SAMPLER_PARTS.match(uri)
    return None if match is None else (match["run_id"], match["name"])
