"""The flows on Prefect: its settings and server plug-in, riding out its outages, task runners,
subflow heartbeats, every page of a read, the cleanup hooks and the reaper's verdicts."""
