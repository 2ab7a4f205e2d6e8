"""Every page of a Prefect read: the server answers at most a page (200 by default) per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def every_page(read: Callable[[int], list[T]]) -> list[T]:
    """Everything `read(offset)` gives, page after page (of the server's size) until one is
    empty. `read` selects, on the server, what only grows while it is read (a tag, a parent, an
    ended state) in a fixed order: a run leaving the selection meanwhile (one that ends, read
    among open ones) would shift a later page past another. Act once everything is read."""
    items: list[T] = []
    while page := read(len(items)):
        items.extend(page)
    return items
