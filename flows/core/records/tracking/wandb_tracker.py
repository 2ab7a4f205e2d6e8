"""Weights & Biases: a run whose id is the lineage key, resumed (`resume="allow"`) when a flow
run continues it. W&B's own variables decide the rest: WANDB_MODE=offline writes the run under
`<dir>/wandb` with no account (`wandb sync` uploads it later), WANDB_PROJECT, WANDB_ENTITY,
WANDB_DIR, WANDB_API_KEY as their users expect. The `experiment` setting, when set, is the
project; W&B does not capture the flow's console (the run's logs are Prefect's). `check_wandb`
refuses, before anything starts, an online run with no credentials."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import wandb

from flows.core.config import ConfigError
from flows.core.records.tracking.backend import RunStatus, TrackedRunSpec

DEFAULT_PROJECT = "whitney-flows"
EXIT_CODES: dict[RunStatus, int] = {"FINISHED": 0, "FAILED": 1, "KILLED": 1}
LOCAL_MODES = ("offline", "dryrun", "disabled")
"""W&B modes that need no account."""


def check_wandb() -> None:
    """ConfigError if W&B would run online with no credentials configured (WANDB_API_KEY, a
    `wandb login`, an identity token); they are not verified with the server here. The mode
    is this process's W&B settings' (WANDB_MODE, `wandb offline`)."""
    if wandb.setup().settings.mode in LOCAL_MODES:
        return
    if not wandb.login(prompt=False, verify=False):
        raise ConfigError(
            "tracking.backends",
            "wandb has no credentials: set WANDB_API_KEY, run `wandb login`, or set "
            "WANDB_MODE=offline",
        )


class WandbTracker:
    """The W&B run of the lineage key, started or resumed."""

    def __init__(self, spec: TrackedRunSpec) -> None:
        directory = None
        if "WANDB_DIR" not in os.environ:
            spec.directory.mkdir(parents=True, exist_ok=True)
            directory = str(spec.directory)
        self.run = wandb.init(
            id=spec.key,
            name=spec.name,
            project=spec.settings.experiment or os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
            dir=directory,
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(console="off"),
        )

    def log_params(self, params: Mapping[str, str]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.run.summary.update(dict(tags))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_file(self, name: str, content: bytes) -> None:
        path = Path(self.run.dir) / name
        path.write_bytes(content)
        self.run.save(str(path), base_path=self.run.dir, policy="now")

    def finish(self, status: RunStatus) -> None:
        self.run.finish(exit_code=EXIT_CODES[status])
