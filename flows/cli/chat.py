"""The `chat` command of `whitney-flows`: a terminal chat with a model of the OpenAI-compatible
routes (docs/openai.md), each answer streamed as it arrives.

    whitney-flows chat MODEL [--api-url URL] [--system TEXT] [--max-tokens N] [--temperature T]

The URL is `--api-url`, else WHITNEY_API_URL; the key comes from WHITNEY_API_KEY. A line is a
user turn; EOF (Ctrl-D) or `/exit` ends the chat. No Prefect
import: the command starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import httpx

from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_FLOW_FAILED, EXIT_OK
from whitney.client import API_KEY_ENV, API_URL_ENV

PROG = "whitney-flows chat"
EXIT_WORDS = frozenset({"/exit", "/quit"})


class ChatError(Exception):
    """Why the chat cannot go on, in one line; `code` is the exit code."""

    def __init__(self, message: str, code: int = EXIT_BAD_CONFIG) -> None:
        super().__init__(message)
        self.code = code


def add_chat_parser(commands: argparse._SubParsersAction) -> None:
    """`chat MODEL` and its options."""
    command = commands.add_parser(
        "chat", help="a terminal chat with a base model, sampler or checkpoint, streamed"
    )
    command.add_argument(
        "model",
        metavar="MODEL",
        help="local/tiny, whitney://runs/<run_id>/samplers/<name> or "
        "whitney://runs/<run_id>/states/<name> (GET /v1/models lists them)",
    )
    command.add_argument(
        "--api-url",
        metavar="URL",
        help="Whitney URL (default: $WHITNEY_API_URL); the key comes from $WHITNEY_API_KEY",
    )
    command.add_argument("--system", metavar="TEXT", help="a system message to start with")
    command.add_argument("--max-tokens", type=int, default=256, metavar="N")
    command.add_argument("--temperature", type=float, default=0.7, metavar="T")


def run_chat(
    options: argparse.Namespace, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout
) -> int:
    """`chat`: turns from `stdin` until EOF or /exit, answers streamed to `stdout`."""
    try:
        url = (options.api_url or os.environ.get(API_URL_ENV) or "").rstrip("/")
        key = os.environ.get(API_KEY_ENV)
        if not url:
            raise ChatError(f"no Whitney URL: pass --api-url or set {API_URL_ENV}")
        if not key:
            raise ChatError(f"no API key: set {API_KEY_ENV}")
        messages: list[dict[str, str]] = []
        if options.system:
            messages.append({"role": "system", "content": options.system})
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=None) as client:
            for line in _turns(stdin, stdout):
                messages.append({"role": "user", "content": line})
                body = {
                    "model": options.model,
                    "messages": messages,
                    "max_tokens": options.max_tokens,
                    "temperature": options.temperature,
                    "stream": True,
                }
                answer = "".join(_print(_stream(client, body), stdout))
                messages.append({"role": "assistant", "content": answer})
    except ChatError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        stdout.write("\n")
    return EXIT_OK


def _turns(stdin: TextIO, stdout: TextIO) -> Iterator[str]:
    """The user's lines (a prompt shown when both ends are a terminal)."""
    interactive = stdin.isatty() and stdout.isatty()
    while True:
        if interactive:
            stdout.write("you> ")
            stdout.flush()
        line = stdin.readline()
        if not line or line.strip() in EXIT_WORDS:
            return
        if line.strip():
            yield line.rstrip("\n")


def _print(pieces: Iterator[str], stdout: TextIO) -> Iterator[str]:
    for piece in pieces:
        stdout.write(piece)
        stdout.flush()
        yield piece
    stdout.write("\n")
    stdout.flush()


def _stream(client: httpx.Client, body: dict[str, Any]) -> Iterator[str]:
    """The content pieces of a streamed chat answer; ChatError for a refusal or no server."""
    try:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                raise ChatError(_refusal(response))
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line.removeprefix("data: ")).get("choices", []):
                    piece = choice.get("delta", {}).get("content")
                    if piece:
                        yield piece
    except httpx.HTTPError as error:
        raise ChatError(f"cannot reach {client.base_url}: {error}", EXIT_FLOW_FAILED) from None


def _refusal(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"{response.status_code}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}"
