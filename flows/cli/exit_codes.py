"""The exit codes of every `whitney-flows` command."""

EXIT_OK = 0
EXIT_FLOW_FAILED = 1
"""The flow run failed, crashed or was cancelled."""
EXIT_NOT_FOUND = 1
"""`inspect` / `export`: no such run."""
EXIT_CHANGED = 1
"""`export --verify`: a file the manifest lists changed."""
EXIT_UNVERIFIED = 1
"""`export --verify`: nothing the manifest lists could be re-hashed on this machine."""
EXIT_REAP_FAILED = 1
"""`reap --apply`: a session could not be closed."""
EXIT_CLOSED_PIPE = 1
"""stdout was closed before the output ended (`| head`): as rich's Console exits then."""
EXIT_BAD_CONFIG = 2
"""Bad arguments, configuration or input file, refused before anything is allocated."""
