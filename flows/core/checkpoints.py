"""The one checkpoint grammar: `save_state` named `cycle-{n}` is the state after cycle n, at
`whitney://runs/{run_id}/states/cycle-{n}`."""

from __future__ import annotations

import re

from flows.core.config import ConfigError

CYCLE_CHECKPOINT = re.compile(
    r"^whitney://runs/(?P<run_id>[A-Za-z0-9_-]+)/states/cycle-(?P<cycle>\d+)$"
)


def checkpoint_name(cycle: int) -> str:
    """The name of the checkpoint saved after cycle `cycle`."""
    return f"cycle-{cycle}"


def checkpoint_due(cycle: int, every: int, cycles: int) -> bool:
    """Whether cycle `cycle` ends with a `cycle-{n}` checkpoint: after every `every` cycles,
    except the flow's last cycle, whose state the final save_state keeps under that name."""
    return every > 0 and (cycle + 1) % every == 0 and cycle < cycles - 1


def checkpoint_cycle(uri: str) -> int:
    """The cycle a `whitney://runs/<run>/states/cycle-<n>` checkpoint was saved after."""
    match = CYCLE_CHECKPOINT.match(uri)
    if match is None:
        raise ValueError(
            f"not a cycle checkpoint: {uri!r} (expected whitney://runs/<run>/states/cycle-<n>)"
        )
    return int(match["cycle"])


def check_resume_from(resume_from: str | None, cycles: int) -> None:
    """ConfigError unless `resume_from` is empty or a cycle checkpoint that leaves cycles
    to train (before anything is allocated)."""
    if not resume_from:
        return
    try:
        cycle = checkpoint_cycle(resume_from)
    except ValueError as error:
        raise ConfigError("resume_from", str(error)) from None
    if cycle + 1 >= cycles:
        raise ConfigError(
            "resume_from",
            f"{resume_from} is the state after cycle {cycle}: nothing is left to train with "
            f"cycles={cycles} (cycles counts from cycle 0; set it above {cycle + 1})",
        )


CHECKPOINT_URI = re.compile(r"^whitney://runs/[A-Za-z0-9_-]+/states/[A-Za-z0-9._-]+$")


def checkpoint_run_id(uri: str) -> str:
    """The run that saved the checkpoint `uri` (whitney://runs/<run>/states/<name>)."""
    if CHECKPOINT_URI.match(uri) is None:
        raise ValueError(f"not a checkpoint: {uri!r} (expected whitney://runs/<run>/states/<name>)")
    return uri.removeprefix("whitney://runs/").split("/", 1)[0]
