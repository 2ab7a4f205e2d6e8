"""Freed memory handed back to the operating system during long work. glibc's allocator keeps
the heap pages of freed tensors resident for reuse, so a long recomputing backward (many chunks
of many segments) would hold about twice what it uses at once; `malloc_trim` releases them."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time

from whitney.local.engine.model import Check

TRIM_INTERVAL_S = 10.0
"""At most one trim this often: every page a trim releases faults in again when reused (a
16 x 1024 forward_backward on SmolLM2 spent 112 of 354 s in the kernel trimming every second,
30 of 306 s every 10 seconds, both peaking at 3.2 GiB)."""


@functools.cache
def trim() -> ctypes._CFuncPtr | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    library = ctypes.util.find_library("c")
    function = getattr(ctypes.CDLL(library), "malloc_trim", None) if library else None
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    return function


def releasing(check: Check) -> Check:
    """`check`, which also returns the allocator's free heap pages to the system, at most once
    every TRIM_INTERVAL_S seconds."""
    function, last = trim(), [time.monotonic()]

    def check_and_release() -> None:
        check()
        now = time.monotonic()
        if function is not None and now - last[0] >= TRIM_INTERVAL_S:
            function(0)
            last[0] = now

    return check_and_release
