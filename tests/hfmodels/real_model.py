"""The real checkpoint of the tests that use one: SmolLM2-135M-Instruct as
`whitney-flows models pull smollm2-135m-instruct` imports it into the Hugging Face cache of
this environment. Where it is missing the test is skipped, saying how to get it; under CI
(`CI=true`, where .ci/run pulls it first) a missing model fails the test instead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from whitney import hf_cache
from whitney.local.model_pull import PULLABLE

PULLED = PULLABLE["smollm2-135m-instruct"]
REPO_ID = PULLED.repo_id


def real_model_snapshot() -> Path:
    """The pulled model's snapshot; pytest.skip (pytest.fail under CI) if it is not there."""
    snapshot = hf_cache.snapshot(REPO_ID)
    if snapshot is not None:
        return snapshot
    why = (
        f"{REPO_ID} is not in the Hugging Face cache {hf_cache.cache_dir()}: "
        "run `whitney-flows models pull smollm2-135m-instruct`"
    )
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"CI: {why} (.ci/run pulls it before pytest)")
    pytest.skip(why)
