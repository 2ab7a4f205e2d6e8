"""Every page of a Prefect read: the server answers at most a page (200 by default) per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def every_page(read: Callable[[int], list[T]]) -> list[T]:
    """Everything `read(offset)` gives, page after page (of the server's size) until one is
    empty."""
    items: list[T] = []
    while page := read(len(items)):
        items.extend(page)
    return items
