"""save_state / load_state / checkpoint_dir, frozen runs, the PEFT export and the hf: backend."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest
import torch

from whitney.errors import WhitneyError
from whitney.local.engine import EngineRun

from .helpers import datum, make_sequences, train_a_little

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
BODY = {"sequences": [{"token_ids": s} for s in make_sequences(4, 3)]}
PAYLOAD = {
    "data": [datum(s[:-1], s[1:]) for s in make_sequences(8, 3)],
    "loss_function": "cross_entropy",
    "loss_config": {},
}


def logprobs(run: EngineRun, name: str) -> list:
    run.save_weights_for_sampler(name)
    return run.logprobs(name, BODY).result["logprobs"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[EngineRun, Path, list]:
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=9)
    train_a_little(run, steps=2)
    directory = tmp_path_factory.mktemp("ckpt") / "state"
    assert run.save_state(directory).result == {"step": 2}
    return run, directory, logprobs(run, "at-save")


def test_checkpoint_dir_reproduces_logprobs_and_training_exactly(trained) -> None:
    run, directory, saved = trained
    resumed = EngineRun.create(
        base_model="local/nano", lora_rank=4, seed=1234, checkpoint_dir=directory
    )
    assert resumed.step == 2
    assert logprobs(resumed, "a") == saved
    for r in (run, resumed):
        r.forward(PAYLOAD, backward=True)
        r.optim_step({"learning_rate": 1e-3})
    for name, p in run.trainable_parameters().items():
        assert torch.equal(p, resumed.trainable_parameters()[name]), name  # moments restored


def test_load_state_with_and_without_optimizer(trained, tmp_path) -> None:
    _, directory, saved = trained
    other = EngineRun.create(base_model="local/nano", lora_rank=4, seed=77)
    other.forward(PAYLOAD, backward=True)
    assert other.load_state(directory).result == {"step": 2}
    assert all(p.grad is None for p in other.trainable_parameters().values())
    assert logprobs(other, "b") == saved
    assert other.optimizer.t == 2
    fresh = EngineRun.create(base_model="local/nano", lora_rank=4, seed=78)
    fresh.load_state(directory, with_optimizer=False)
    assert fresh.step == 2 and fresh.optimizer.t == 0
    assert all(torch.count_nonzero(m) == 0 for m in fresh.optimizer.m.values())
    with pytest.raises(WhitneyError) as err:
        EngineRun.create(base_model="local/nano", lora_rank=8, seed=1).load_state(directory)
    assert err.value.type == "invalid_request" and "lora_rank" in err.value.message
    with pytest.raises(WhitneyError) as err:
        fresh.load_state(tmp_path / "missing")
    assert err.value.type == "invalid_request"


def test_frozen_run_only_samples(trained, tmp_path) -> None:
    _, directory, saved = trained
    frozen = EngineRun.create(
        base_model="local/nano", lora_rank=4, seed=0, trainable=False, checkpoint_dir=directory
    )
    assert logprobs(frozen, "t") == saved
    frozen.save_weights_for_sampler("t2")
    assert frozen.samplers["t2"] == frozen.samplers["t"] and len(frozen.snapshots) == 1
    refused = [
        lambda: frozen.forward(PAYLOAD, backward=False),
        lambda: frozen.forward(PAYLOAD, backward=True),
        lambda: frozen.optim_step({}),
        lambda: frozen.save_state(tmp_path / "x"),
        lambda: frozen.load_state(directory),
        lambda: frozen.export_lora(tmp_path / "x.tar"),
    ]
    for call in refused:
        with pytest.raises(WhitneyError) as err:
            call()
        assert err.value.type == "invalid_request"


def test_export_is_deterministic_and_loads_in_peft(trained, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    run = trained[0]
    first = run.export_lora(tmp_path / "a.tar").result
    second = run.export_lora(tmp_path / "b.tar").result
    data = (tmp_path / "a.tar").read_bytes()
    assert data == (tmp_path / "b.tar").read_bytes()
    assert (
        first
        == second
        == {"format": "peft", "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    )
    with tarfile.open(tmp_path / "a.tar") as tar:
        assert tar.getnames() == [
            "adapter_config.json",
            "adapter_model.safetensors",
            "base_model/config.json",
            "base_model/model.safetensors",
        ]
        assert {m.mtime for m in tar.getmembers()} == {0}
        tar.extractall(tmp_path / "x", filter="data")
    base = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "x" / "base_model", dtype=torch.float32
    )
    model = peft.PeftModel.from_pretrained(base, tmp_path / "x").eval()
    engine = logprobs(run, "export")
    for seq, got in zip(BODY["sequences"], engine, strict=True):
        ids = seq["token_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
        want = [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]
        assert got[1:] == pytest.approx(want, abs=1e-5)
    # the hf: backend serves the exported base weights like local/nano itself
    hf_run = EngineRun.create(base_model=f"hf:{tmp_path / 'x' / 'base_model'}", lora_rank=4, seed=9)
    plain = EngineRun.create(base_model="local/nano", lora_rank=4, seed=9)
    assert logprobs(hf_run, "h") == logprobs(plain, "h")


def test_unsupported_base_models() -> None:
    for name in ("local/huge", "gpt2", "hf:no-such-org/no-such-model"):
        with pytest.raises(WhitneyError) as err:
            EngineRun.create(base_model=name, lora_rank=4, seed=0)
        assert err.value.type == "unsupported_base_model" and name in err.value.message
