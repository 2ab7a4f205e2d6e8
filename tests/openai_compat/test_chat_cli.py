"""`whitney-flows chat MODEL`: a terminal chat over the OpenAI-compatible routes, in its own
process against the suite's embedded server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai

from whitney.local import EmbeddedWhitney

ROOT = Path(__file__).resolve().parents[2]


def chat(
    server: EmbeddedWhitney, *args: str, stdin: str, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WHITNEY_API_URL": server.url,
        "WHITNEY_API_KEY": key or server.api_key,
    }
    return subprocess.run(
        [sys.executable, "-m", "flows.cli.main", "chat", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_chat_streams_each_answer_and_keeps_the_conversation(
    embedded_server: EmbeddedWhitney,
) -> None:
    done = chat(
        embedded_server,
        "local/nano",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        stdin="hi\nand then?\n/exit\n",
    )
    assert done.returncode == 0, done.stderr
    client = openai.OpenAI(
        base_url=f"{embedded_server.url}/v1", api_key=embedded_server.api_key, max_retries=0
    )
    messages = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(
        model="local/nano", messages=messages, max_tokens=8, temperature=0
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and then?"},
    ]
    second = client.chat.completions.create(
        model="local/nano", messages=messages, max_tokens=8, temperature=0
    )
    client.close()
    expected = f"{first.choices[0].message.content}\n{second.choices[0].message.content}\n"
    assert done.stdout == expected


def test_a_model_that_is_not_there_is_one_line_and_exit_2(embedded_server: EmbeddedWhitney) -> None:
    done = chat(embedded_server, "whitney://runs/run-0000000000000000/samplers/x", stdin="hi\n")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "404" in done.stderr and "model" in done.stderr
    assert "Traceback" not in done.stderr
    wrong_key = chat(embedded_server, "local/nano", stdin="hi\n", key="not-a-key")
    assert wrong_key.returncode == 2 and "401" in wrong_key.stderr
    assert "not-a-key" not in wrong_key.stderr
