"""Prefect blocks for Whitney: `WhitneyCredentials`, and loading a saved one by name.

Register the block type with `prefect block register -m blocks`; save one with
`python -m blocks save NAME --base-url URL` (the key from WHITNEY_API_KEY or a prompt).
Which Whitney a flow run talks to (this block, the environment, or an embedded server) is
decided by `blocks/endpoint.py`. Imports whitney and prefect, never flows or tasks; the
block is imported on first use, so `blocks.connection` loads no Prefect.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from blocks.credentials import BlockNotFound, WhitneyCredentials, load_credentials

__all__ = ["BlockNotFound", "WhitneyCredentials", "load_credentials"]


def __getattr__(name: str) -> Any:
    """`blocks.WhitneyCredentials` and the rest of `__all__`, imported on first use."""
    if name in __all__:
        return getattr(importlib.import_module("blocks.credentials"), name)
    raise AttributeError(f"module 'blocks' has no attribute {name!r}")


def __dir__() -> list[str]:
    """`__all__` too, so `prefect block register -m blocks` finds the block."""
    return sorted([*globals(), *__all__])
