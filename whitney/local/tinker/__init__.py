"""Tinker's REST API (the official `tinker` SDK's routes) on the embedded server, over the same
engine, journal, tenants and limits as Whitney's routes (docs/tinker.md)."""
