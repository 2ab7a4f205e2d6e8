"""Prefect tasks, one per Whitney operation and per Whitney-only step a flow takes, and how flows
submit them: the operation tasks, a task on a connection and the sequenced client
(`tasks.operations`), the retry policy (`tasks.retry`), the names and the release of a flow run's
sessions."""
