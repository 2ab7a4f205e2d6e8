"""Prefect blocks for Whitney: `WhitneyCredentials`, and the resolution of the endpoint a flow
run talks to (block, then environment, then an embedded server).

Register the block type with `prefect block register -m blocks`; save one with
`python -m blocks save NAME --base-url URL` (the key from WHITNEY_API_KEY or a prompt).
Imports whitney and prefect, never flows or tasks.
"""

from blocks.credentials import WhitneyCredentials
from blocks.resolve import (
    BlockNotFound,
    WhitneyEndpoint,
    load_credentials,
    resolve_whitney,
    whitney_endpoint,
)

__all__ = [
    "BlockNotFound",
    "WhitneyCredentials",
    "WhitneyEndpoint",
    "load_credentials",
    "resolve_whitney",
    "whitney_endpoint",
]
