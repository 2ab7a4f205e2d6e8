"""Deterministic seeds: the same (config seed, cycle, prompt index) always gives the same
sampling seed, in any process, so a replayed cycle sends byte-identical sample requests."""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, *parts: int) -> int:
    """A 31-bit seed derived from `seed` and `parts` (e.g. cycle, prompt index) by SHA-256."""
    text = ":".join(str(value) for value in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") >> 1
