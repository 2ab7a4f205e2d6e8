"""The checkpoint URI grammar of `whitney.uris`, which the server and the flows share."""

from __future__ import annotations

import re

import pytest

from whitney.uris import (
    CHECKPOINT_PATTERN,
    checkpoint_pattern,
    checkpoint_regex,
    checkpoint_run_id,
    checkpoint_uri,
    sampler_uri,
    split_checkpoint,
    split_sampler,
)


def test_a_checkpoint_uri_splits_back_into_its_run_and_name() -> None:
    uri = checkpoint_uri("run-1a_B", "cycle-3")
    assert uri == "whitney://runs/run-1a_B/states/cycle-3"
    assert split_checkpoint(uri) == ("run-1a_B", "cycle-3")
    assert checkpoint_run_id(uri) == "run-1a_B"
    assert re.match(CHECKPOINT_PATTERN, uri)


@pytest.mark.parametrize(
    "uri",
    [
        "whitney://runs/run-1/states/",
        "whitney://runs/run-1/states/a/b",
        "whitney://runs/run 1/states/x",
        "whitney://run/run-1/states/x",
        "https://runs/run-1/states/x",
    ],
)
def test_other_strings_are_not_checkpoints(uri: str) -> None:
    assert re.match(CHECKPOINT_PATTERN, uri) is None
    with pytest.raises(ValueError, match="not a checkpoint"):
        checkpoint_run_id(uri)


def test_split_leaves_the_name_to_the_server_and_patterns_carry_no_groups() -> None:
    assert split_checkpoint("whitney://runs/run-1/states/bad name") == ("run-1", "bad name")
    assert "(?P<" not in checkpoint_pattern("cycle-[0-9]+")
    match = checkpoint_regex(r"cycle-(?P<cycle>\d+)").match("whitney://runs/r/states/cycle-12")
    assert match is not None and (match["run_id"], match["cycle"]) == ("r", "12")


def test_a_sampler_uri_splits_back_into_its_run_and_sampler() -> None:
    uri = sampler_uri("run-0123456789abcdef", "cycle-3")
    assert uri == "whitney://runs/run-0123456789abcdef/samplers/cycle-3"
    assert split_sampler(uri) == ("run-0123456789abcdef", "cycle-3")
    assert split_sampler(checkpoint_uri("run-0123456789abcdef", "cycle-3")) is None
    assert split_checkpoint(uri) is None
    assert split_sampler("whitney://runs/run-1/samplers/a/b") is None
