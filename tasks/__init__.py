"""Prefect tasks, one per Whitney operation and per Whitney-only step a flow takes, and how flows
submit them: the retry policy and a task on a connection (`tasks.calls`), the
sequenced client (`tasks.sequenced_client`), the names and the release of a flow run's sessions."""
