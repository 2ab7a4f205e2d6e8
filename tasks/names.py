"""The names the flows give things on Whitney, in one place: the labels of their sessions and
runs, and the one `cycle-{n}` grammar of checkpoints and samplers.

`save_state` named `cycle-{n}` is the state after cycle n, at
`whitney://runs/{run_id}/states/cycle-{n}`; a pipelined cycle n samples from the sampler named
`cycle-{n}`, which cycle n-1 published.
"""

from __future__ import annotations

import re

from whitney.uris import checkpoint_pattern, checkpoint_regex

FLOW_RUN_LABEL = "prefect.flow-run-id"
"""Every session a flow opens bears its flow run id under this label."""
PARENT_FLOW_RUN_LABEL = "prefect.parent-flow-run-id"
"""A flow run as a subflow (the SFT flow training a distillation teacher) adds its parent's."""
AUXILIARY_LABEL = "whitney-flows.rl.auxiliary"
"""An auxiliary run (a critic, a reference) bears its name under this label."""

CYCLE_NAME = r"cycle-(?P<cycle>\d+)"
CYCLE_CHECKPOINT_PATTERN = checkpoint_pattern("cycle-[0-9]+")
"""What a config's `resume_from` must match (the UI form shows it)."""
CYCLE_CHECKPOINT = checkpoint_regex(CYCLE_NAME)
CYCLE_SAMPLER = re.compile(rf"^{CYCLE_NAME}$")
EVAL_SAMPLER = re.compile(r"^eval-(?P<cycle>\d+)$")
"""The sampler an inline evaluation after cycle n samples from: `eval-{n}`."""


def cycle_name(cycle: int) -> str:
    """The name of the checkpoint saved after cycle `cycle`, and of the sampler cycle `cycle`
    samples from in a pipelined flow."""
    return f"cycle-{cycle}"


START_EVAL_SAMPLER = "eval-start"
"""The sampler of the inline evaluation of the weights before the first cycle."""


def eval_sampler_name(cycle: int) -> str:
    """The sampler of the inline evaluation of the weights after cycle `cycle`."""
    return f"eval-{cycle}"


def checkpoint_cycle(uri: str) -> int:
    """The cycle a `whitney://runs/<run>/states/cycle-<n>` checkpoint was saved after."""
    match = CYCLE_CHECKPOINT.match(uri)
    if match is None:
        raise ValueError(
            f"not a cycle checkpoint: {uri!r} (expected whitney://runs/<run>/states/cycle-<n>)"
        )
    return int(match["cycle"])
