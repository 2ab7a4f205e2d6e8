"""Prefect flows over Whitney: the RL flow, its cycle subflows, recipes, environments, cleanup
hooks, records, and the `whitney-flows` CLI. Modules import what they need; this one nothing."""
