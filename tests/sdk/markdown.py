"""Reading the markdown the docs tests check."""

from __future__ import annotations


def table(text: str, header: str) -> list[list[str]]:
    """The rows (lists of stripped cells) of the markdown table whose header line is `header`."""
    lines = text.splitlines()
    assert header in lines, f"missing table {header!r}"
    rows = []
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows
