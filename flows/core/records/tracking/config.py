"""The `tracking` setting of every flow config: which experiment trackers the run is sent to
(MLflow, TensorBoard, Weights & Biases) and where. No Prefect, no tracker imported here:
a chosen tracker whose package is missing is refused, naming the extra that installs it.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from flows.core.fields import NonEmpty, Settings

Backend = Literal["mlflow", "tensorboard", "wandb"]
BACKENDS: tuple[Backend, ...] = ("mlflow", "tensorboard", "wandb")
"""Each tracker is the extra of the same name, and the package it imports."""


def installed(package: str) -> bool:
    """Whether `package` can be imported (a module set to None in sys.modules cannot)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(backend: Backend) -> str:
    """The one line that refuses a tracker whose package is not installed."""
    return f"{backend} is not installed: pip install 'whitney-flows[{backend}]'"


class TrackingSettings(Settings):
    """Where a flow run's params, per-cycle metrics, evaluations, learning curves and exported
    adapter go, besides Prefect's artifacts and the metrics file."""

    backends: list[Backend] = Field(
        default_factory=list,
        description="The experiment trackers to send the run to: mlflow, tensorboard, wandb "
        "(each the extra of its name); empty: none",
    )
    dir: NonEmpty = Field(
        default="tracking",
        description="Where the local tracker files go (relative to the flow's working "
        "directory): MLflow's local store (mlflow.db, mlartifacts/) unless a tracking URI is "
        "set, TensorBoard's event files (tensorboard/), Weights & Biases' run directories "
        "(wandb/, unless WANDB_DIR says otherwise)",
    )
    tracking_uri: NonEmpty | None = Field(
        default=None,
        description="MLflow tracking URI (a server's http://host:port, a database); empty: "
        "MLFLOW_TRACKING_URI, else the local store under `dir`",
    )
    experiment: NonEmpty | None = Field(
        default=None,
        description="The MLflow experiment and the W&B project; empty: MLFLOW_EXPERIMENT_NAME "
        "and WANDB_PROJECT, else whitney-flows",
    )

    @field_validator("backends")
    @classmethod
    def _installed_once(cls, backends: list[Backend]) -> list[Backend]:
        for backend in backends:
            if not installed(backend):
                raise PydanticCustomError("missing_extra", missing_extra(backend))
        if len(set(backends)) != len(backends):
            raise PydanticCustomError("duplicate", "each tracker at most once")
        return backends
