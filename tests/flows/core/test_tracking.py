"""Experiment trackers, read back with their own readers: a real `mlflow server` (started and
stopped here) read through MLflow's client, TensorBoard's event files through TensorBoard's
EventAccumulator, a W&B offline run's file through W&B's record protos. A resumed flow run and
a retried one continue their tracked run; no API key reaches a tracker; a tracker whose extra
is missing is refused in one line."""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import wandb
from flowtest_helpers import assert_released
from flowtest_mlflow import MlflowServer, free_port, start_mlflow_server
from flowtest_records import records_once
from flowtest_resume_plugins import fail_once_at_cycle
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from pydantic import BaseModel
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from flows.cli.main import main
from flows.core.config import ConfigError, settings_with_overrides, validated
from flows.core.records.plots import picture_beside
from flows.core.records.run_records import RunRecords
from flows.core.records.tracking import delivery
from flows.core.records.tracking.backend import LINEAGE_TAG, TrackedRunSpec
from flows.core.records.tracking.config import Backend, TrackingSettings
from flows.core.records.tracking.delivery import shown
from flows.core.records.tracking.params import config_params, redacted, text
from flows.core.records.tracking.preflight import check_tracking
from flows.core.records.tracking.session import Tracking, start_backend
from flows.core.records.tracking.tensorboard_tracker import TensorBoardTracker
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.metrics import RLResult
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney


@pytest.fixture(scope="module")
def booting_mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """`mlflow server` started on a free loopback port with a SQLite store in a temporary
    directory (it boots while the tests before the one that waits for it run), stopped by its
    PID (its process group)."""
    server = start_mlflow_server(tmp_path_factory.mktemp("mlflow-server"), free_port())
    try:
        yield server
    finally:
        server.stop()


def tracked_config(api_url: str, tmp_path: Path, **tracking: Any) -> RLConfig:
    """A short RL run on local/tiny, checkpointed and evaluated after each cycle."""
    return RLConfig(
        api_url=api_url,
        base_model="local/tiny",
        cycles=2,
        prompts_per_cycle=3,
        group_size=4,
        max_tokens=8,
        seed=5,
        checkpoint_every=1,
        eval_every=1,
        cycle_retries=0,
        metrics_path=str(tmp_path / "metrics.jsonl"),
        tracking=tracking,
    )


def exported_sha256(inspector: WhitneyClient, run_id: str) -> str:
    """The sha256 the server's journal holds for the run's export_lora."""
    (export,) = [op for op in inspector.journal(run_id, limit=1000) if op.kind == "export_lora"]
    return export.result["sha256"]


def wandb_history(run_file: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, metrics) of every history record of a W&B run file: a LevelDB-style log of
    32 KiB blocks of chunks (crc32, length, type) after a 7-byte header, each record a
    `wandb_internal_pb2.Record`."""
    data, block, position = run_file.read_bytes(), 32768, 7
    history, pending = [], b""
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                history.append((record.history.step.num, items))
    return history


@pytest.mark.usefixtures("booting_mlflow_server")  # boots meanwhile, for the last test
def test_tensorboard_wandb_and_a_local_mlflow_store_through_a_retry(
    whitney: EmbeddedWhitney, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flow run whose cycle 1 fails once and which Prefect retries: one tracked run on each
    backend, with every cycle once, in the local store (no tracking URI anywhere)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    directory = tmp_path / "tracking"
    config = tracked_config(
        whitney.url, tmp_path, backends=["mlflow", "tensorboard", "wandb"], dir=str(directory)
    ).model_copy(update={"eval_every": 0, "env": "flowtest_resume_plugins:FailOnceAtCycle"})
    failed_once = fail_once_at_cycle(monkeypatch, 1, tmp_path)
    state = rl_flow.with_options(retries=1)(config, return_state=True)
    assert state.is_completed(), state.message
    assert failed_once.exists()
    result: RLResult = state.result()
    assert result.resumed_from is not None  # the retry resumed from cycle-0
    metrics = [json.loads(line) for line in Path(config.metrics_path).read_text().splitlines()]
    rewards = {row["cycle"]: row["reward_mean"] for row in metrics}  # both attempts' cycles
    assert sorted(rewards) == [0, 1]
    picture = picture_beside(Path(config.metrics_path)).read_bytes()
    key = str(state.state_details.flow_run_id)  # the lineage of a flow run from the base model

    (run_directory,) = (directory / "tensorboard").iterdir()
    assert run_directory.name.endswith(key)
    events = EventAccumulator(str(run_directory), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    scalars = events.Scalars("reward_mean")
    assert [event.step for event in scalars] == [0, 1]
    assert [event.value for event in scalars] == pytest.approx([rewards[n] for n in range(2)])
    (image,) = events.Images("learning_curves")
    assert image.encoded_image_string == picture
    assert {"params", "summary", "adapter", "status"} <= set(events.Tags()["tensors"])
    (status,) = events.Tensors("status")
    assert status.tensor_proto.string_val == [b"FINISHED"]

    (wandb_run,) = (directory / "wandb").glob(f"offline-run-*-{key}")
    history = wandb_history(wandb_run / f"run-{key}.wandb")
    per_cycle = [(step, row["reward_mean"]) for step, row in history if "reward_mean" in row]
    assert per_cycle == [(n, rewards[n]) for n in range(2)]
    assert (wandb_run / "files" / "learning_curves.png").read_bytes() == picture
    adapter = json.loads((wandb_run / "files" / "adapter.json").read_text())
    assert adapter["adapter"]["sha256"] == result.adapter.sha256

    client = MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("whitney-flows").experiment_id])
    assert run.data.tags[LINEAGE_TAG] == key and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(n, rewards[n]) for n in range(2)]
    assert run.info.artifact_uri.startswith((directory / "mlartifacts").resolve().as_uri())

    secret = whitney.api_key.encode()
    leaks = [
        path for path in directory.rglob("*") if path.is_file() and secret in path.read_bytes()
    ]
    assert leaks == []


def test_params_are_the_config_flattened_with_nothing_secret() -> None:
    config = RLConfig(
        api_url="https://alice:hunter2@whitney.example:8443/v1",
        tracking={"backends": [], "tracking_uri": "http://bob:pw@mlflow.example"},
        loss_config={"clip_low": 0.2},
    )
    params = config_params(config)
    assert params["api_url"] == "https://whitney.example:8443/v1"
    assert params["tracking.tracking_uri"] == "http://mlflow.example"
    assert params["task_retry.retries"] == "3" and params["loss_config.clip_low"] == "0.2"
    assert params["budget.max_tokens"] == "null" and params["max_tokens"] == "12"
    assert not [value for value in params.values() if "hunter2" in value or ":pw@" in value]


class PluginSettings(BaseModel):
    """A plug-in's settings: URLs inside a list, a table and a sentence."""

    mirrors: list[str]
    options: dict[str, Any]
    note: str


PASSWORD = "hunter2-in-a-value"
SHAPES = {
    "list": ["https://alice:hunter2-in-a-value@mirror.example/data", "file:///tmp/x"],
    "table": {
        "source": {"url": "s3://key:hunter2-in-a-value@bucket/prefix", "retries": 2},
        "hosts": [{"url": "postgres://u:hunter2-in-a-value@db.example/runs"}],
        "api_key": "hunter2-in-a-value",
    },
    "json in a string": '{"db": "postgres://u:hunter2-in-a-value@db.example/runs"}',
    "sentence": "data from https://bob:hunter2-in-a-value@data.example/a.jsonl, see docs",
    "password with @": "https://carol:hunter2-in-a-value@x@host.example:9/a?mail=a@b.c",
}
CLEAN = {
    "list": ["https://mirror.example/data", "file:///tmp/x"],
    "table": {
        "source": {"url": "s3://bucket/prefix", "retries": 2},
        "hosts": [{"url": "postgres://db.example/runs"}],
    },
    "json in a string": '{"db": "postgres://db.example/runs"}',
    "sentence": "data from https://data.example/a.jsonl, see docs",
    "password with @": "https://host.example:9/a?mail=a@b.c",
}


@pytest.mark.parametrize("shape", SHAPES)
def test_credentials_inside_a_value_are_cut_out(shape: str) -> None:
    assert redacted(SHAPES[shape]) == CLEAN[shape]
    assert PASSWORD not in text(SHAPES[shape])


def test_params_hold_no_credentials_in_lists_tables_or_sentences() -> None:
    settings = PluginSettings(
        mirrors=SHAPES["list"],
        options={"table": SHAPES["table"], "json": SHAPES["json in a string"]},
        note=SHAPES["sentence"],
    )
    params = config_params(settings)
    assert json.loads(params["mirrors"]) == CLEAN["list"]
    assert params["options.table.source.url"] == "s3://bucket/prefix"
    assert json.loads(params["options.table.hosts"]) == CLEAN["table"]["hosts"]
    assert params["options.json"] == CLEAN["json in a string"]
    assert params["note"] == CLEAN["sentence"]
    assert "options.table.api_key" not in params
    assert not [value for value in params.values() if PASSWORD in value]


class TrackedResult(BaseModel):
    """A flow's result: its adapter and a manifest whose config holds credentials."""

    run_id: str
    adapter: dict[str, Any]
    manifest: dict[str, Any]


def feed_credentials(tracking: Tracking) -> None:
    """What a flow run sends a tracker, with a password in every shape: the params, the
    summary, the result's adapter (a file and tags) and manifest (a file); then the end."""
    settings = PluginSettings(
        mirrors=SHAPES["list"], options=SHAPES["table"], note=SHAPES["sentence"]
    )
    tracking.each("params", lambda tracker: tracker.log_params(config_params(settings)))
    tracking.log_summary(f"| data | {SHAPES['sentence']} |", None)
    manifest = {"config": {"mirrors": SHAPES["list"], "note": SHAPES["json in a string"]}}
    adapter = {"sha256": "0" * 64, "source": SHAPES["password with @"]}
    tracking.log_result(TrackedResult(run_id="run-1", adapter=adapter, manifest=manifest))
    tracking.finish("FINISHED")


def test_nothing_a_tracker_stores_holds_a_credential(tmp_path: Path) -> None:
    """Params, tags, the summary and the result's files through a real TensorBoard tracker:
    its event files, read back with TensorBoard's reader, hold the values without the
    credentials, and no byte of them the password."""
    settings = TrackingSettings(backends=["tensorboard"], dir=str(tmp_path))
    spec = TrackedRunSpec(key="lineage-1", name="rl-test", settings=settings)
    logger = logging.LoggerAdapter(logging.getLogger("test-tracking"), {})
    feed_credentials(Tracking({"tensorboard": TensorBoardTracker(spec)}, logger))

    (run_directory,) = (tmp_path / "tensorboard").iterdir()
    stored = b"".join(path.read_bytes() for path in run_directory.iterdir())
    assert PASSWORD.encode() not in stored
    events = EventAccumulator(str(run_directory), size_guidance={"tensors": 0})
    events.Reload()
    written = {
        tag: event.tensor_proto.string_val[0].decode()
        for tag in ("params", "summary", "manifest", "adapter", "tags")
        for event in events.Tensors(tag)
    }
    assert "https://mirror.example/data" in written["params"]
    assert CLEAN["sentence"] in written["params"] and CLEAN["sentence"] in written["summary"]
    assert json.loads(written["manifest"].strip("`\n"))["config"] == {
        "mirrors": CLEAN["list"],
        "note": CLEAN["json in a string"],
    }
    assert CLEAN["password with @"] in written["adapter"]
    assert CLEAN["password with @"] in written["tags"]


@pytest.mark.parametrize("backend", ["mlflow", "wandb"])
def test_nothing_mlflow_or_wandb_stores_holds_a_credential(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through MLflow's local store and a W&B offline run: every byte either
    stored under the tracking directory (MLflow's SQLite database and artifacts, W&B's run
    file and files) is searched for the password, and the redacted values are there."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    settings = TrackingSettings(backends=[backend], dir=str(tmp_path))
    spec = TrackedRunSpec(key=f"lineage-{backend}", name="rl-test", settings=settings)
    logger = logging.LoggerAdapter(logging.getLogger("test-tracking"), {})
    feed_credentials(Tracking({backend: start_backend(backend, spec)}, logger))

    stored = [path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()]
    assert not [data for data in stored if PASSWORD.encode() in data]
    everything = b"".join(stored)
    for value in (CLEAN["sentence"], "https://mirror.example/data", "postgres://db.example/runs"):
        assert value.encode() in everything


@pytest.mark.parametrize("backend", ["mlflow", "tensorboard", "wandb"])
def test_a_missing_tracker_is_refused_naming_its_extra(
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
    refused: Any,
) -> None:
    monkeypatch.setitem(sys.modules, backend, None)  # `import backend` raises ImportError
    with pytest.raises(ConfigError) as error:
        validated(RLConfig, {"tracking": {"backends": [backend]}})
    assert error.value.field == "tracking.backends"
    assert error.value.message == (
        f"{backend} is not installed: pip install 'whitney-flows[{backend}]'"
    )
    refused("rl", ["--tracking", backend], "tracking.backends", error.value.message)


def test_tracking_on_the_command_line_goes_over_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "rl.toml"
    path.write_text('[tracking]\nbackends = ["wandb"]\ndir = "runs/tracking"\n')
    overrides = {"tracking": {"backends": ["mlflow", "tensorboard"]}, "cycles": None}
    config = validated(RLConfig, settings_with_overrides(path, overrides))
    assert config.tracking.backends == ["mlflow", "tensorboard"]
    assert config.tracking.dir == "runs/tracking"
    unchanged = validated(RLConfig, settings_with_overrides(path, {"tracking": None}))
    assert unchanged.tracking.backends == ["wandb"]


def test_run_with_tracking_writes_tensorboard_files_in_the_working_directory(
    whitney: EmbeddedWhitney,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    arguments = ["--api-url", whitney.url, "--base-model", "local/tiny", "--cycles", "2"]
    arguments += ["--metrics-out", str(metrics), "--tracking", "tensorboard"]
    assert main(["run", "rl", *arguments]) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    (run_directory,) = (tmp_path / "tracking" / "tensorboard").iterdir()
    events = EventAccumulator(str(run_directory))
    events.Reload()
    scalars = events.Scalars("loss")
    assert [(event.step, event.value) for event in scalars] == [
        (row["cycle"], pytest.approx(row["loss"])) for row in rows
    ]
    assert main(["run", "rl", *arguments, "--tracking", "mlflow,mlflow"]) == 2
    assert "each tracker at most once" in capsys.readouterr().err


def test_mlflow_server_gets_the_run_and_a_resumed_run_continues_it(
    booting_mlflow_server: MlflowServer,
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Last in this module: the server has booted meanwhile."""
    mlflow_server = booting_mlflow_server.ready()
    config = tracked_config(
        whitney.url,
        tmp_path,
        backends=["mlflow"],
        tracking_uri=mlflow_server,
        experiment="e2e-tracking",
    )
    first = rl_flow(config)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # the resumed run's, from MLflow's
    tracking = config.tracking.model_copy(update={"tracking_uri": None})  # own variable
    update = {"cycles": 3, "resume_from": first.checkpoint, "tracking": tracking}
    resumed = rl_flow(config.model_copy(update=update))

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("e2e-tracking")
    (run,) = client.search_runs([experiment.experiment_id])  # one tracked run for both
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["learning_rate"] == "0.002" and params["base_model"] == "local/tiny"
    assert params["cycles"] == "2" and params["group_size"] == "4"
    assert params["tracking.tracking_uri"] == mlflow_server
    tags = run.data.tags
    assert tags["whitney_flows.changed.cycles"] == "3"  # the resumed run's changes, beside
    assert tags["whitney_flows.changed.tracking.tracking_uri"] == "null"
    assert tags["whitney.resumed_from"] == first.checkpoint
    assert tags["whitney.run_id"] == resumed.run_id

    cycles = [*first.cycles, *resumed.cycles]
    history = client.get_metric_history(run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(c.cycle, c.reward_mean) for c in cycles]
    evaluations = client.get_metric_history(run_id, "eval.reward_mean")
    assert [(m.step, m.value) for m in evaluations] == [
        (c.cycle, c.eval.reward_mean) for c in cycles
    ]

    artifacts = Path(client.download_artifacts(run_id, "", str(tmp_path / "artifacts")))
    picture = artifacts / "learning_curves.png"
    assert picture.read_bytes() == picture_beside(Path(config.metrics_path)).read_bytes()
    assert picture.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    adapter = json.loads((artifacts / "adapter.json").read_text())
    assert adapter["adapter"]["sha256"] == exported_sha256(inspector, resumed.run_id)
    assert adapter["checkpoint"] == resumed.checkpoint
    assert "Whitney run" in (artifacts / "summary.md").read_text()

    key = whitney.api_key  # WHITNEY_API_KEY of the flow runs
    assert os.environ["WHITNEY_API_KEY"] == key
    texts = [*params.values(), *params, *tags.values(), *tags]
    texts += [path.read_text(errors="replace") for path in artifacts.rglob("*") if path.is_file()]
    assert not [text for text in texts if key in text]


def test_a_file_store_is_refused_before_anything_starts(
    refused: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLFLOW_TRACKING_URI=file:./mlruns, which MLflow 3 refuses: one line naming the fix,
    exit 2, no session (`refused`), no store written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:./mlruns")
    message = (
        "MLflow 3 refuses the file store file:./mlruns (MLFLOW_TRACKING_URI): use a database "
        "(sqlite:///mlflow.db; `mlflow migrate-filestore` moves ./mlruns there)"
    )
    refused("rl", ["--tracking", "mlflow"], "tracking.tracking_uri", message)
    assert list(tmp_path.iterdir()) == []


def test_a_flow_run_given_a_file_store_fails_before_its_first_cycle(
    whitney: EmbeddedWhitney,
    inspector: WhitneyClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flow run started without `whitney-flows run` (as a deployment's) makes the same
    check before its first cycle: it fails in the same line, trains nothing, and releases its
    Whitney run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    config = tracked_config(
        whitney.url, tmp_path, backends=["mlflow"], tracking_uri="file:./mlruns"
    )
    state = rl_flow(config, return_state=True)
    assert state.is_failed()
    assert (
        "tracking.tracking_uri: MLflow 3 refuses the file store file:./mlruns (tracking_uri)"
        in (state.message)
    )
    assert not Path(config.metrics_path).exists() and not (tmp_path / "mlruns").exists()
    assert_released(inspector, state.state_details.flow_run_id)


def test_wandb_online_with_no_credentials_is_refused_before_anything_starts(
    refused: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W&B online with no API key anywhere (no variable, an empty netrc, a fresh config
    directory): one line naming the fix, exit 2, no session; offline needs none."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.chdir(tmp_path)
    wandb.teardown()  # W&B's settings are read once per process: read them again
    try:
        message = "wandb has no credentials: set WANDB_API_KEY, run `wandb login`, or set "
        refused("rl", ["--tracking", "wandb"], "tracking.backends", message + "WANDB_MODE=offline")
        wandb.teardown()
        monkeypatch.setenv("WANDB_MODE", "offline")
        check_tracking(TrackingSettings(backends=["wandb"]), reach=True)
    finally:
        wandb.teardown()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    """Poll `condition` until it holds; fail past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def test_an_mlflow_server_stopped_mid_run_never_fails_the_training(
    whitney: EmbeddedWhitney,
    refused: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`whitney-flows run rl --tracking mlflow` on a real `mlflow server`, stopped after cycle
    0 and started again after cycle 1, stopped for good after cycle 2: the run completes,
    cycle 1's metrics arrive late by the retries, each outage is warned about once, and the
    summary records both gaps; what the second one held back is given up at the end. Then
    the stopped server's URL is refused before anything starts."""
    directory, port = tmp_path / "mlflow-server", free_port()
    directory.mkdir()
    servers = [start_mlflow_server(directory, port)]
    url = servers[-1].ready()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "outage")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own: fail at once
    monkeypatch.setattr(delivery, "FINISH_WAIT_S", 1.0)  # for what the stopped server misses
    client = MlflowClient(tracking_uri=url)

    def steps() -> list[int]:
        """The cycles whose reward_mean the server holds."""
        experiment = client.get_experiment_by_name("outage")
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        history = client.get_metric_history(runs[0].info.run_id, "reward_mean") if runs else []
        return [metric.step for metric in history]

    add_cycle = RunRecords.add_cycle

    def add_cycle_then_stop_or_start(records: RunRecords, metrics: Any) -> None:
        add_cycle(records, metrics)
        mlflow = records.tracking.deliveries["mlflow"]
        if metrics.cycle in (0, 2):
            wait_until(lambda: steps() == list(range(metrics.cycle + 1)), "cycle delivered")
            servers[-1].stop()
        elif metrics.cycle == 1:
            wait_until(lambda: bool(mlflow.gaps), "the stopped server noticed")
            servers.append(start_mlflow_server(directory, port))
            servers[-1].ready()
            wait_until(lambda: steps() == [0, 1], "cycle 1 delivered late by a retry")

    monkeypatch.setattr(RunRecords, "add_cycle", add_cycle_then_stop_or_start)
    metrics_path = work / "metrics.jsonl"
    arguments = ["--api-url", whitney.url, "--base-model", "local/tiny", "--cycles", "3"]
    arguments += ["--metrics-out", str(metrics_path), "--tracking", "mlflow"]
    try:
        assert main(["run", "rl", *arguments]) == 0, capsys.readouterr().err
        rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
        store = MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}")  # the server's
        experiment = store.get_experiment_by_name("outage")
        (run,) = store.search_runs([experiment.experiment_id])
        history = store.get_metric_history(run.info.run_id, "reward_mean")
        assert [(m.step, m.value) for m in history] == [
            (row["cycle"], pytest.approx(row["reward_mean"])) for row in rows
        ]
        assert run.info.status == "RUNNING"  # its end was never delivered
    finally:
        servers[-1].stop()

    flow_run_id = UUID(run.data.tags["prefect.flow_run_id"])
    records = records_once(
        flow_run_id,
        lambda r: (
            any("never got the" in line for line in r.log_messages())
            and any((a.key or "").endswith("-tracking-gaps") for a in r.artifacts)
        ),
    )
    lines = records.log_messages()
    assert len([line for line in lines if "mlflow cannot take the" in line]) == 2  # 2 outages
    assert len([line for line in lines if "mlflow is back" in line]) == 1
    (lost,) = [line for line in lines if "mlflow never got the" in line]
    assert lost.startswith("Tracking: mlflow never got the summary, ") and lost.endswith(", end")
    (record,) = [a for a in records.artifacts if (a.key or "").endswith("-tracking-gaps")]
    gaps = re.findall(r"^\| mlflow \| (.*) \|$", record.data, re.MULTILINE)
    assert len(gaps) == 2, record.data
    late = r"unreachable \S+ UTC to \S+ UTC \(.+\); [1-9]\d* calls delivered late"
    assert re.fullmatch(late, gaps[0]), gaps[0]
    assert re.fullmatch(r"unreachable from \S+ UTC \(.+\): never got the summary, .*, end", gaps[1])

    message = f"the MLflow server at {url} does not answer: start it, or correct "
    refused(
        "rl", ["--tracking", "mlflow"], "tracking.tracking_uri", message + "MLFLOW_TRACKING_URI"
    )


def test_a_trackers_error_is_shown_without_url_credentials() -> None:
    """MLflow's errors quote the URL they called: its user and password never reach the flow
    run's log, its tracking gaps or the refusal of a server that does not answer."""
    port = free_port()  # nothing listens there
    settings = TrackingSettings(
        backends=["mlflow"], tracking_uri=f"http://bob:s3cret@127.0.0.1:{port}"
    )
    with pytest.raises(ConfigError) as refusal:
        check_tracking(settings, reach=True)
    assert str(refusal.value) == (
        f"tracking.tracking_uri: the MLflow server at http://127.0.0.1:{port} does not answer: "
        "start it, or correct tracking_uri"
    )
    error = MlflowException(
        "API request to https://bob:s3cret@mlflow.example/api/2.0/mlflow/runs/log-batch failed"
    )
    assert shown(error) == (
        "MlflowException('API request to https://mlflow.example/api/2.0/mlflow/runs/log-batch "
        "failed')"
    )
