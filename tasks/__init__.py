"""Prefect tasks, one per Whitney operation and per Whitney-only step a flow takes (their retry
policy and connection: `whitney_calls`)."""
