"""How close the server's logprobs on SmolLM2 are to transformers' float32 forward, on the chats
of tests/hfmodels/test_real_checkpoint.py (its measure is tests/hfmodels/parity.py): the base
model, then after three SFT steps the server's own, the exported adapter loaded with PEFT and
the merged export. Prints the largest difference of a target token's logprob for each (the
test only holds them to 1e-4), with progress; docs/real-models.md quotes them.

    python benchmarks/real_checkpoint_parity.py [--steps 3] [--learning-rate 1e-3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from real_model_learning import machine, pulled  # noqa: E402

from flows.cli.main import main as whitney_flows  # noqa: E402
from tests.hfmodels.parity import (  # noqa: E402
    hf_target_logprobs,
    max_difference,
    server_target_logprobs,
    sft_payload,
)
from whitney import hf_cache  # noqa: E402
from whitney.client import WhitneyClient  # noqa: E402
from whitney.local import EmbeddedWhitney  # noqa: E402
from whitney.local.model_pull import PULLABLE  # noqa: E402
from whitney.renderers import get_renderer  # noqa: E402
from whitney.tokenizers import get_tokenizer  # noqa: E402

MODEL = PULLABLE["smollm2-135m-instruct"].repo_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    options = parser.parse_args()
    snapshot = pulled(MODEL)
    os.environ["HF_HUB_OFFLINE"] = "1"
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    print(f"machine: {machine()}", flush=True)
    renderer = get_renderer("chat_template", get_tokenizer(MODEL), MODEL)
    payload = sft_payload(renderer)
    base = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    with (
        EmbeddedWhitney(hf_cache=hf_cache.cache_dir()) as server,
        WhitneyClient(server.url, server.api_key) as client,
        tempfile.TemporaryDirectory() as tmp,
    ):
        session = client.open_session({"whitney-flows.role": "real-checkpoint-parity"})
        run_id = client.create_run(session.session_id, "local", MODEL, lora_rank=8, seed=1).run_id
        before = max_difference(
            server_target_logprobs(client, run_id, payload), hf_target_logprobs(base, payload)
        )
        print(f"base model: server against transformers float32 {before:.1e}", flush=True)
        for step in range(options.steps):
            client.run_operation(run_id, "forward_backward", payload)
            optimizer = {"type": "adamw", "learning_rate": options.learning_rate}
            client.run_operation(run_id, "optim_step", {"optimizer": optimizer})
            print(f"SFT step {step + 1} of {options.steps} done", flush=True)
        after = server_target_logprobs(client, run_id, payload)
        os.environ["WHITNEY_API_KEY"] = server.api_key
        for flags, name in (((), "peft"), (("--merged",), "merged")):
            out = str(Path(tmp) / name)
            code = whitney_flows(["export", run_id, "--out", out, "--api-url", server.url, *flags])
            if code != 0:
                sys.exit(f"export {name} exited {code}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            peft = AutoPeftModelForCausalLM.from_pretrained(Path(tmp) / "peft").eval()
            merged = AutoModelForCausalLM.from_pretrained(Path(tmp) / "merged").eval()
            for label, model in (("PEFT", peft), ("merged", merged)):
                difference = max_difference(after, hf_target_logprobs(model, payload))
                print(
                    f"after {options.steps} SFT steps: server against the {label} export "
                    f"(transformers float32) {difference:.1e}",
                    flush=True,
                )
        client.close_session(session.session_id)
    print(f"machine at the end: {machine()}")


if __name__ == "__main__":
    main()
