"""The check of a config's trackers before anything starts: what a tracker would refuse (an
MLflow file store, W&B online with no credentials) or cannot reach (an MLflow server that does
not answer or refuses the credentials) is a ConfigError naming the fix. No Prefect."""

from __future__ import annotations

from flows.core.records.tracking.config import TrackingSettings


def check_tracking(settings: TrackingSettings, reach: bool) -> None:
    """ConfigError if a chosen tracker refuses its settings; with `reach`, also if its
    server does not answer or refuses the credentials (asked once, no retries)."""
    if "mlflow" in settings.backends:
        from flows.core.records.tracking.mlflow_tracker import check_mlflow

        check_mlflow(settings, reach)
    if "wandb" in settings.backends:
        from flows.core.records.tracking.wandb_tracker import check_wandb

        check_wandb()
