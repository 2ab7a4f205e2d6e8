"""The `whitney-flows` command: parsers, exit codes, the terminal display, run / inspect /
runs / export."""
