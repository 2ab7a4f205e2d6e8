"""Prefect blocks for Whitney: `WhitneyCredentials`, and loading a saved one by name.

Register the block type with `prefect block register -m blocks`; save one with
`python -m blocks save NAME --base-url URL` (the key from WHITNEY_API_KEY or a prompt).
Which Whitney a flow run talks to (this block, the environment, or an embedded server) is
decided by `flows/core/endpoint.py`. Imports whitney and prefect, never flows or tasks.
"""

from blocks.credentials import BlockNotFound, WhitneyCredentials, load_credentials

__all__ = ["BlockNotFound", "WhitneyCredentials", "load_credentials"]
