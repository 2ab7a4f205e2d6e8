"""`serve --capture FILE`: every answered exchange of the OpenAI-compatible routes becomes a
line `whitney-flows run sft` reads as it is; off by default."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import openai

from flows.sft.corpus import read_examples
from whitney.local import EmbeddedWhitney

ROOT = Path(__file__).resolve().parents[2]


def test_exchanges_are_captured_as_sft_lines_and_nothing_by_default(
    tmp_path: Path, embedded_server: EmbeddedWhitney
) -> None:
    assert embedded_server.service.capture is None  # off by default
    path = tmp_path / "traffic.jsonl"
    key = "capture-test-key"
    with EmbeddedWhitney(api_keys=[key], session_ttl_s=0, capture=path) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ]
        chat = client.chat.completions.create(
            model="local/nano", messages=messages, n=2, max_tokens=6, seed=1
        )
        streamed = client.completions.create(
            model="local/nano", prompt="The", max_tokens=4, seed=2, stream=True
        )
        completion = "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
        client.close()
    examples = read_examples(path)
    answers = [choice.message.content for choice in chat.choices]
    assert [list(e.messages) for e in examples[:2]] == [
        [*messages, {"role": "assistant", "content": answer}] for answer in answers
    ]
    assert (examples[2].prompt, examples[2].completion) == ("The", completion)
    assert len(examples) == 3
    assert key not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_serve_refuses_a_capture_file_without_a_directory_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "traffic.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli.main", "serve", "--port", "0", "--capture", str(missing)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "WHITNEY_LOCAL_API_KEYS": "k"},
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"whitney-flows serve: --capture: no directory for {str(missing)!r}"
    ]
