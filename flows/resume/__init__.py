"""The automatic resume: a training flow run that crashed, or failed on an infrastructure
error, continued from its latest checkpoint by a new flow run of its deployment."""
