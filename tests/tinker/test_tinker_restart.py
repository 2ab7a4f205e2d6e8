"""Across a restart: the server is SIGKILLed after an `optim_step` was answered and started
again on the same data directory; the resent request gets the original future and answer, the
run goes on from where it was, and its journal holds that step once. A signed download URL
issued before a restart still serves after it (its key is in the data directory, never in the
server's log)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import tinker
from tinker.proto import tinker_public_pb2 as pb

from tests.local.served import served
from tests.tinker.steps import KEYS, sdk_key, stepped_training_client
from whitney import WhitneyClient

TOKENS = [5, 9, 12, 40, 41]
PROTO = {"Content-Type": "application/x-protobuf"}


def _forward_backward(model_id: str, seq_id: int) -> bytes:
    message = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray(TOKENS[:-1], np.int32).tobytes()
    target = datum.loss_fn_inputs["target_tokens"]
    target.dtype, target.dense = pb.DTYPE_INT64, np.asarray(TOKENS[1:], np.int64).tobytes()
    target.shape.append(len(TOKENS) - 1)
    return message.SerializeToString()


def _answer(api: httpx.Client, request_id: str) -> dict:
    while True:
        answer = api.post("/api/v1/retrieve_future", json={"request_id": request_id}, timeout=120)
        assert answer.status_code == 200, answer.text
        if answer.json().get("type") != "try_again":
            return answer.json()


def test_a_request_resent_after_a_restart_gets_its_original_answer(tmp_path: Path) -> None:
    with served(tmp_path, keys=KEYS) as server:
        api = httpx.Client(base_url=server.url, headers={"X-API-Key": sdk_key(0)}, timeout=60)
        session = api.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
        model = {"session_id": session, "model_seq_id": 0, "base_model": "local/tiny"}
        model_id = api.post("/api/v1/create_model", json=model).json()["model_id"]
        first = api.post(
            "/api/v1/forward_backward", content=_forward_backward(model_id, 1), headers=PROTO
        ).json()
        step = {"model_id": model_id, "seq_id": 2, "optim_params": {"learning_rate": 0.01}}
        future = api.post("/api/v1/optim_step", json=step).json()
        before = _answer(api, future["request_id"])
        api.post("/api/v1/retrieve_future", json={"request_id": first["request_id"]})
        api.close()

        server.kill()
        server.restart()
        api = httpx.Client(base_url=server.url, headers={"X-API-Key": sdk_key(0)}, timeout=60)
        assert api.post("/api/v1/optim_step", json=step).json() == future
        assert _answer(api, future["request_id"]) == before
        deadline = time.monotonic() + 120
        while True:  # 503 while the run is rebuilt: the SDK retries it, as here
            again = api.post(
                "/api/v1/forward_backward", content=_forward_backward(model_id, 3), headers=PROTO
            )
            if again.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert again.status_code == 200, again.text
        request_id = again.json()["request_id"]
        answer = api.post("/api/v1/retrieve_future", json={"request_id": request_id}, timeout=120)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith(
            "application/x-protobuf"
        )
        api.close()
        with WhitneyClient(server.url, KEYS[0]) as client:
            kinds = [op.kind for op in client.iter_journal(model_id)]
        assert kinds == ["forward_backward", "optim_step", "forward_backward"]


def test_a_signed_url_serves_after_a_restart(tmp_path: Path) -> None:
    with served(tmp_path, keys=KEYS) as server:
        service, training = stepped_training_client(server.url, tenant=0)
        export = training.save_weights_external("adapter").result().path
        rest = tinker.RestClient(base_url=server.url, api_key=sdk_key(0))
        urls = rest.get_external_weights_urls(export).result().urls
        before = {
            name: urllib.request.urlopen(url, timeout=60).read() for name, url in urls.items()
        }
        service.close("success").result()
        key_file = tmp_path / "served-data" / "tinker-url-key"
        key = key_file.read_bytes()
        assert len(key) == 32 and key_file.stat().st_mode & 0o777 == 0o600

        server.kill()
        server.restart()
        after = {name: urllib.request.urlopen(url, timeout=60).read() for name, url in urls.items()}
        assert after == before and "adapter_model.safetensors" in after
        assert key_file.read_bytes() == key
    log = server.log.read_bytes()
    assert key not in log and key.hex().encode() not in log
