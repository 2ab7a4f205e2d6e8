"""Prefect tasks, one per Whitney operation, and their retry policy."""
