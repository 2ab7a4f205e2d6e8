"""The embedded Whitney server: the Whitney API over a local CPU engine (see `embedded.py`).

Importing this package is cheap (no torch, no FastAPI); they load when a server starts.
"""

from whitney.local.embedded import EmbeddedWhitney, ServerStartError

__all__ = ["EmbeddedWhitney", "ServerStartError"]
