"""tinker-cookbook 0.6.1, unmodified, trains against the served process on SmolLM2-135M-Instruct
(our config: `tests/tinker/cookbook_configs.py`), and its final checkpoint goes away as an
archive that PEFT loads, computing what the server computes, and loads back into a new
training client. The longer SL and RL runs are `benchmarks/tinker_front.py --cookbook`."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.hfmodels.real_model import real_model_snapshot
from tests.local.served import ServedWhitney
from tests.tinker.steps import sdk_key

try:
    from tests.tinker.cookbook_configs import metrics, sl_config, write_chats
except ImportError:  # the cookbook: .ci/run installs it (pip install --no-deps, see docs/tinker.md)
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        raise
    pytest.skip("tinker-cookbook is not installed (docs/tinker.md)", allow_module_level=True)

TOLERANCE = 1e-3
"""Log-probabilities of the served model and of PEFT's, float32 either way."""


@pytest.fixture
def sdk_env(monkeypatch: pytest.MonkeyPatch) -> None:
    real_model_snapshot()  # SmolLM2, pulled: skipped without it (failed under CI)
    monkeypatch.setenv("TINKER_API_KEY", sdk_key(0))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.filterwarnings("ignore::FutureWarning")  # PEFT calls a deprecated API
def test_the_cookbooks_supervised_loop_learns_and_its_checkpoint_goes_to_peft(
    server: ServedWhitney, sdk_env: None, tmp_path: Path
) -> None:
    import tinker
    import torch
    from peft import AutoPeftModelForCausalLM
    from tinker import types
    from tinker_cookbook.supervised import train

    log_path = tmp_path / "sl"
    config = sl_config(server.url, log_path, write_chats(tmp_path / "chats.jsonl"), steps=2)
    asyncio.run(train.main(config))
    losses = [m["train_mean_nll"] for m in metrics(log_path) if "train_mean_nll" in m]
    assert len(losses) == 2 and losses[1] < losses[0]

    final = (log_path / "checkpoints.jsonl").read_text().splitlines()[-1]
    state_path = json.loads(final)["state_path"]
    service = tinker.ServiceClient(base_url=server.url)
    training = service.create_training_client_from_state(state_path).result()
    exported = training.save_weights_external("peft").result().path
    rest = tinker.RestClient(base_url=server.url)
    peft_dir = tmp_path / "peft"
    for name, url in rest.get_external_weights_urls(exported).result().urls.items():
        (peft_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (peft_dir / name).write_bytes(urllib.request.urlopen(url, timeout=120).read())

    tokens = training.get_tokenizer().encode("User: What is 3 plus 4?\n\nAssistant: 3 plus 4 is 7.")
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:]},
    )
    output = training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]
    served = np.asarray(output["logprobs"].data)

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = AutoPeftModelForCausalLM.from_pretrained(peft_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]])).logits[0].double()
    ours = torch.log_softmax(logits, -1)[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
    assert np.abs(ours.numpy() - served).max() <= TOLERANCE
    with torch.no_grad(), model.disable_adapter():
        base = torch.log_softmax(model(torch.tensor([tokens[:-1]])).logits[0].double(), -1)
    moved = base[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].numpy()
    assert np.abs(moved - served).max() > 10 * TOLERANCE  # the adapter is the trained one
