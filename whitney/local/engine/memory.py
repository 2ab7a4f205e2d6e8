"""Freed memory handed back to the operating system during long work. glibc's allocator keeps
the heap pages of freed tensors resident for reuse, so a long recomputing backward (many chunks
of many segments) would hold about twice what it uses at once; `malloc_trim` releases them."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

from whitney.local.engine.model import Check

TRIM_FREE_BYTES = 1 << 30
"""A trim once the heap holds this much free: what a process keeps resident beyond what it
uses stays below it, and pages are handed back (each faults in again when reused) only in
bulk. Trimming by the clock instead (every 1 s) cost a 16 x 1024 forward_backward on SmolLM2
112 of 354 s in the kernel."""


class MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2`."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def library() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


@functools.cache
def trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    function = getattr(library(), "malloc_trim", None)
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


@functools.cache
def free_heap() -> Callable[[], int] | None:
    """The bytes the heap holds free (glibc's mallinfo2 `fordblks`, over every arena), or None
    where the C library cannot say (before glibc 2.33, musl, macOS)."""
    function = getattr(library(), "mallinfo2", None)
    if function is None:
        return None
    function.argtypes, function.restype = [], MallInfo2
    return lambda: function().fordblks


def releasing(check: Check) -> Check:
    """`check`, which also returns the allocator's free heap pages to the system once the heap
    holds TRIM_FREE_BYTES free."""
    release, free = trim(), free_heap()

    def check_and_release() -> None:
        check()
        if release is not None and free is not None and free() >= TRIM_FREE_BYTES:
            release(0)

    return check_and_release
