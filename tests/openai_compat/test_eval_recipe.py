"""examples/openai_eval.py, run as a user runs it against a checkpoint of the embedded server:
its score is the count of references that Whitney's own greedy `sample` (top_k 1) of the same
weights reproduces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.local.helpers import http, new_run, run_op, sample_request
from whitney.local import EmbeddedWhitney

ROOT = Path(__file__).resolve().parents[2]
BOS, EOS = 256, 257
MAX_TOKENS = 6


def greedy(api: httpx.Client, run_id: str, seq: int, prompt: str) -> str:
    """Whitney's greedy answer to a user turn `prompt` on a local/* model (raw renderer)."""
    request = sample_request([BOS, *prompt.encode()], 1, MAX_TOKENS, top_k=1, stop_token_ids=[EOS])
    tokens = run_op(api, run_id, seq, "sample", request, "now")["result"]["sequences"][0]["tokens"]
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


def test_the_eval_recipe_scores_a_checkpoint(
    tmp_path: Path, embedded_server: EmbeddedWhitney
) -> None:
    with http(embedded_server) as api:
        run_id = new_run(api, base_model="local/nano", lora_rank=2, seed=9)["run_id"]
        run_op(api, run_id, 1, "save_state", {"name": "final"})
        run_op(api, run_id, 2, "save_weights_for_sampler", {"name": "now"})  # the same weights
        answers = [greedy(api, run_id, 3 + i, p) for i, p in enumerate(("ab", "cd"))]
    assert all(a.strip() for a in answers)  # a reference SFT data may hold
    lines = [
        {"prompt": "ab", "completion": answers[0]},
        {
            "messages": [
                {"role": "user", "content": "cd"},
                {"role": "assistant", "content": answers[1]},
            ]
        },
        {"prompt": "ef", "completion": "not what it says"},
    ]
    data = tmp_path / "held-out.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WHITNEY_API_URL": embedded_server.url,
        "WHITNEY_API_KEY": embedded_server.api_key,
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "openai_eval.py"),
            f"whitney://runs/{run_id}/states/final",
            str(data),
            "--max-tokens",
            str(MAX_TOKENS),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exact match 2/3 (66.7%)\n"
    assert done.stderr.splitlines()[-1] == "3/3  exact 2"
