"""MLflow: a run in an experiment, found again by its lineage tag when a flow run continues it.

The tracking URI is the `tracking_uri` setting, else MLFLOW_TRACKING_URI, else a local store
under the tracking directory: `sqlite:///<dir>/mlflow.db`, its artifacts in
`<dir>/mlartifacts` (MLflow 3 refuses a new file store). The experiment is the `experiment`
setting, else MLFLOW_EXPERIMENT_NAME, else whitney-flows. MLflow's own variables (credentials,
MLFLOW_TRACKING_TOKEN, retries) work as usual. `check_mlflow` refuses, before anything
starts, a tracking URI MLflow would refuse (a file store), and a server that does not answer
or refuses the credentials.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.rest_utils import http_request

from flows.core.config import ConfigError
from flows.core.records.tracking.backend import LINEAGE_TAG, RunStatus, TrackedRunSpec
from flows.core.records.tracking.config import TrackingSettings
from flows.core.records.tracking.params import without_credentials

DEFAULT_EXPERIMENT = "whitney-flows"
CHANGED_PREFIX = "whitney_flows.changed."
"""A continued run's setting that differs from its first value: this tag, with the new one."""
BATCH = 100
"""MLflow's limit of params per log_batch."""
PROBE_TIMEOUT_S = 10
"""How long the check before the start waits for a tracking server's answer."""
URI_FIELD = "tracking.tracking_uri"


def tracking_uri(settings: TrackingSettings) -> str:
    """Where the run goes: the setting, MLFLOW_TRACKING_URI, or the local store."""
    found = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if found:
        return found
    directory = Path(settings.dir)
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(directory / 'mlflow.db').resolve()}"


def uri_source(settings: TrackingSettings) -> str:
    """Where the tracking URI was set, as a user would look for it."""
    return "tracking_uri" if settings.tracking_uri else "MLFLOW_TRACKING_URI"


def check_mlflow(settings: TrackingSettings, reach: bool) -> None:
    """ConfigError (naming the fix) if MLflow refuses the tracking URI (a file store, an
    unknown scheme) or, with `reach`, if the server at an http(s) URI does not answer or
    refuses the credentials (MLflow's own variables), asked once with no retries."""
    uri = tracking_uri(settings)
    shown = without_credentials(uri)
    try:
        client = MlflowClient(tracking_uri=uri)
    except MlflowException as error:
        if "filesystem tracking backend" in error.message:
            raise ConfigError(
                URI_FIELD,
                f"MLflow 3 refuses the file store {shown} ({uri_source(settings)}): use a "
                "database (sqlite:///mlflow.db; `mlflow migrate-filestore` moves ./mlruns "
                "there) or a server's http://host:port, or set MLFLOW_ALLOW_FILE_STORE=true",
            ) from None
        first = without_credentials(error.message.split(". ")[0].splitlines()[0])
        raise ConfigError(URI_FIELD, f"MLflow refuses {shown}: {first}") from None
    if not reach or not uri.startswith(("http://", "https://")):
        return
    credentials = client._tracking_client.store.get_host_creds()  # MLflow's variables
    try:
        response = http_request(
            credentials,
            "/api/2.0/mlflow/experiments/search",
            "GET",
            max_retries=0,
            timeout=PROBE_TIMEOUT_S,
            params={"max_results": 1},
        )
    except MlflowException:
        raise ConfigError(
            URI_FIELD,
            f"the MLflow server at {shown} does not answer: start it, or correct "
            f"{uri_source(settings)}",
        ) from None
    if response.status_code in (401, 403):
        raise ConfigError(
            URI_FIELD,
            f"the MLflow server at {shown} refuses the credentials (HTTP {response.status_code}):"
            " set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN",
        )
    if response.status_code != 200:
        raise ConfigError(
            URI_FIELD,
            f"{shown} answers HTTP {response.status_code} to MLflow's API: is it an MLflow "
            f"server? correct {uri_source(settings)}",
        )


def experiment_id(client: MlflowClient, spec: TrackedRunSpec, uri: str) -> str:
    """The experiment's id, created if new (its artifacts under the tracking directory when
    the store is the local one)."""
    name = spec.settings.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    local = uri.startswith("sqlite:") and not spec.settings.tracking_uri
    artifacts = (spec.directory / "mlartifacts").resolve().as_uri() if local else None
    return client.create_experiment(name, artifact_location=artifacts)


class MlflowTracker:
    """A run of the experiment, with the lineage tag; continued (status RUNNING again) when
    one with the same key exists."""

    def __init__(self, spec: TrackedRunSpec) -> None:
        uri = tracking_uri(spec.settings)
        self.client = MlflowClient(tracking_uri=uri)
        experiment = experiment_id(self.client, spec, uri)
        found = self.client.search_runs(
            [experiment], f"tags.`{LINEAGE_TAG}` = '{spec.key}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {LINEAGE_TAG: spec.key}
            run = self.client.create_run(experiment, run_name=spec.name, tags=tags)
            self.run_id = run.info.run_id

    def log_params(self, params: Mapping[str, str]) -> None:
        known = self.client.get_run(self.run_id).data.params
        new = [Param(name, value) for name, value in params.items() if name not in known]
        for start in range(0, len(new), BATCH):
            self.client.log_batch(self.run_id, params=new[start : start + BATCH])
        changed = {
            f"{CHANGED_PREFIX}{name}": value
            for name, value in params.items()
            if name in known and known[name] != value
        }
        self.set_tags(changed)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if tags:
            rows = [RunTag(name, value) for name, value in tags.items()]
            self.client.log_batch(self.run_id, tags=rows)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        rows = [Metric(name, value, now, step) for name, value in metrics.items()]
        for start in range(0, len(rows), 1000):
            self.client.log_batch(self.run_id, metrics=rows[start : start + 1000])

    def log_file(self, name: str, content: bytes) -> None:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / name
            path.write_bytes(content)
            self.client.log_artifact(self.run_id, str(path))

    def finish(self, status: RunStatus) -> None:
        self.client.set_terminated(self.run_id, status)
