"""Checkpoints a user can take away: the REST client lists the training runs and their
checkpoints, and an exported adapter downloads through its signed URLs, file for file the
archive `export_lora` wrote (the same bytes WhitneyClient downloads)."""

from __future__ import annotations

import hashlib
import tarfile
import urllib.error
import urllib.request

import tinker
from tinker import types

from tests.local.served import ServedWhitney
from tests.tinker.steps import KEYS, sdk_key, stepped_training_client
from whitney import WhitneyClient


def test_runs_checkpoints_and_the_external_weights_download(
    server: ServedWhitney, tmp_path
) -> None:
    _, training = stepped_training_client(server.url, tenant=1)
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    state = training.save_state("kept").result().path
    sampler = training.save_weights_for_sampler("snap").result().path
    export = training.save_weights_external("adapter").result().path

    rest = tinker.RestClient(base_url=server.url, api_key=sdk_key(1))
    listed = rest.list_checkpoints(training.model_id).result().checkpoints
    assert [c.tinker_path for c in listed] == [state, sampler, export]
    assert [c.checkpoint_type for c in listed] == ["training", "sampler", "external"]
    run = rest.get_training_run(training.model_id).result()
    assert (run.base_model, run.lora_rank, run.is_lora) == ("local/tiny", 4, True)
    assert run.last_checkpoint.tinker_path == state
    runs = rest.list_training_runs(limit=100).result()
    assert training.model_id in [r.training_run_id for r in runs.training_runs]
    other = tinker.RestClient(base_url=server.url, api_key=sdk_key(0))
    assert training.model_id not in [
        r.training_run_id for r in other.list_training_runs(limit=100).result().training_runs
    ]

    urls = rest.get_external_weights_urls(export).result().urls
    downloaded = {
        name: urllib.request.urlopen(url, timeout=60).read() for name, url in urls.items()
    }
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(downloaded)
    artifact_id = export.rsplit("/", 1)[1]
    with WhitneyClient(server.url, KEYS[1]) as client:
        archive = client.download_artifact(artifact_id, tmp_path / "adapter.tar")
    with tarfile.open(archive) as tar:
        expected = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    digest = {name: hashlib.sha256(data).hexdigest() for name, data in downloaded.items()}
    assert digest == {name: hashlib.sha256(data).hexdigest() for name, data in expected.items()}
    forged = urls["adapter_config.json"].replace(
        "/api/v1/external_weights/", "/api/v1/external_weights/x"
    )
    try:
        urllib.request.urlopen(forged, timeout=60)
        raise AssertionError("a forged URL was served")
    except urllib.error.HTTPError as error:
        assert error.code == 404
