"""Tinker's REST API (the official `tinker` SDK's routes) on the embedded server, over the same
engine, journal, tenants and limits as Whitney's routes (docs/tinker.md)."""

SDK_VERSION = "0.38.0"
"""The `tinker` SDK version these routes are checked against (the `tinker` extra pins it)."""
