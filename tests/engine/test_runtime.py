"""The EngineRun surface: tokenizer, datum validation, gradient accumulation, usage, and
determinism across threads and processes."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from whitney.errors import WhitneyError
from whitney.local.engine import BASE_MODELS, EngineRun
from whitney.tokenizers import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer, get_tokenizer

from .helpers import datum, make_sequences, python_json

ROOT = Path(__file__).resolve().parents[2]


def test_byte_tokenizer() -> None:
    tok = get_tokenizer("local/tiny")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 260
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (BOS_ID, EOS_ID, PAD_ID) == (256, 257, 258)
    assert tok.encode("hé<eos>") == [104, 195, 169, 60, 101, 111, 115, 62]
    assert tok.decode([BOS_ID, 104, 195, 169, EOS_ID, PAD_ID]) == "hé"
    assert tok.decode([0xFF]) == "\ufffd"
    for name in ("gpt2", "hf:no-such-org/no-such-model"):
        with pytest.raises(ValueError, match=name):
            get_tokenizer(name)
    assert BASE_MODELS == ("local/nano", "local/tiny", "local/small")


def cycle(seed: int) -> dict:
    """A short RL-shaped cycle; everything it returns must be bit-identical on replay."""
    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=seed)
    run.save_weights_for_sampler("s")
    prompt = [256, 1, 2, 3]
    req = {"prompt": {"token_ids": prompt}, "num_samples": 4, "sampling_params": {"max_tokens": 8}}
    sample = run.sample("s", [req], [seed])[0].result
    data = []
    for k, seq in enumerate(sample["sequences"]):
        full = prompt + seq["tokens"]
        pad = len(prompt) - 1
        data.append(
            datum(
                full[:-1],
                full[1:],
                weights=[0.0] * pad + [1.0] * len(seq["tokens"]),
                logprobs=[0.0] * pad + seq["logprobs"],
                advantages=[0.0] * pad + [k - 1.5] * len(seq["tokens"]),
            )
        )
    fb = run.forward({"data": data, "loss_function": "ppo", "loss_config": {}}, backward=True)
    step = run.optim_step({"learning_rate": 1e-2})
    lora = {n: t.detach().flatten()[:4].tolist() for n, t in run.lora.parameters().items()}
    return {"sample": sample, "fb": fb.result, "step": step.result, "lora": lora}


def test_bit_identical_across_threads_and_processes() -> None:
    expected = cycle(3)
    results: dict[int, dict] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, cycle(3))) for i in range(2)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results[0] == expected and results[1] == expected
    code = (
        "import json, sys; from tests.engine.test_runtime import cycle; "
        "sys.stdout.write(json.dumps(cycle(3)))"
    )
    env_threads = str(torch.get_num_threads())
    environment = {"OMP_NUM_THREADS": env_threads, "PATH": "/usr/bin"}
    printed = python_json(code, environment, timeout=600, cwd=ROOT)
    assert printed == json.loads(json.dumps(expected))
    assert cycle(4)["sample"] != expected["sample"]


def test_gradients_accumulate_until_optim_step() -> None:
    seqs = make_sequences(12, 4)
    data = [datum(s[:-1], s[1:]) for s in seqs]

    def payload(d):
        return {"data": d, "loss_function": "cross_entropy", "loss_config": {}}

    run = EngineRun.create(base_model="local/nano", lora_rank=4, seed=1)
    out = run.forward(payload(data), backward=False)
    assert all(p.grad is None for p in run.trainable_parameters().values())
    assert out.usage == {"tokens": sum(len(s) - 1 for s in seqs)}
    run.forward(payload(data[:2]), backward=True)
    run.forward(payload(data[2:]), backward=True)
    split = {n: p.grad.clone() for n, p in run.trainable_parameters().items()}
    for p in run.trainable_parameters().values():
        p.grad = None
    whole = run.forward(payload(data), backward=True)
    assert whole.result["loss"] == pytest.approx(out.result["loss"], rel=1e-6)
    for n, p in run.trainable_parameters().items():
        torch.testing.assert_close(split[n], p.grad, rtol=1e-4, atol=1e-5 * p.grad.abs().max())


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["loss_inputs"].pop("target_tokens"), "target_tokens"),
        (lambda d: d["loss_inputs"]["weights"]["values"].pop(), "weights"),
        (lambda d: d["input"].__setitem__("token_ids", []), "token_ids"),
        (lambda d: d["input"]["token_ids"].__setitem__(0, 999), "token_ids"),
        (lambda d: d["loss_inputs"]["target_tokens"]["values"].__setitem__(0, -1), "target_tokens"),
        (lambda d: d["loss_inputs"]["weights"]["values"].__setitem__(0, float("inf")), "weights"),
    ],
)
def test_invalid_datums_name_index_and_tensor(mutate, field) -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=2, seed=1)
    data = [datum(s[:-1], s[1:], weights=[1.0] * (len(s) - 1)) for s in make_sequences(2, 2)]
    mutate(data[1])
    with pytest.raises(WhitneyError) as err:
        run.forward(
            {"data": data, "loss_function": "cross_entropy", "loss_config": {}}, backward=True
        )
    assert err.value.type == "invalid_datum"
    assert "data[1]" in err.value.message and field in err.value.message
    assert err.value.details == {"datum": 1, "tensor": field}


def test_invalid_loss_config_and_run_arguments() -> None:
    run = EngineRun.create(base_model="local/nano", lora_rank=2, seed=1)
    s = make_sequences(2, 1)[0]
    d = datum(s[:-1], s[1:], logprobs=[0.0] * (len(s) - 1), advantages=[1.0] * (len(s) - 1))
    with pytest.raises(WhitneyError) as err:
        run.forward(
            {"data": [d], "loss_function": "ppo", "loss_config": {"clip_low_threshold": "x"}},
            backward=True,
        )
    assert err.value.type == "invalid_loss_config" and "clip_low_threshold" in err.value.message
    with pytest.raises(WhitneyError) as err:
        run.forward({"data": [], "loss_function": "cross_entropy"}, backward=True)
    assert err.value.type == "invalid_datum"
    for kwargs in ({"lora_rank": 0}, {"role": "judge"}):
        with pytest.raises(WhitneyError) as err:
            EngineRun.create(**({"base_model": "local/nano", "lora_rank": 2, "seed": 0} | kwargs))
        assert err.value.type == "invalid_request"


def test_hf_tokenizer_wraps_a_local_tokenizer(tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "<unk>": 4}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(tmp_path)
    tok = get_tokenizer(f"hf:{tmp_path}")
    assert tok.eos_id == 1
    assert tok.encode("ab</s>") == [2, 3, 4, 4, 4, 4]  # the special token is not parsed from text
    assert tok.decode([2, 1, 3]).replace(" ", "") == "ab"
