"""The ids the server makes and the names it accepts for states and samplers."""

from __future__ import annotations

import re
import secrets

NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def new_id(prefix: str) -> str:
    """A fresh id: `prefix-` and 16 random hex digits."""
    return f"{prefix}-{secrets.token_hex(8)}"


def valid_name(name: str) -> bool:
    """Whether `name` may name a state or a sampler (a path segment, never `.` or `..`)."""
    return bool(NAME.match(name)) and name not in (".", "..")
