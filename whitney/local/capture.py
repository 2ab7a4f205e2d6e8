"""`Capture`: `serve --capture FILE` appends every answered exchange of the OpenAI-compatible
routes to FILE as one JSON line that `whitney-flows run sft` reads as it is: a chat as
`{"messages": [..., {"role": "assistant", "content": ...}]}`, a text completion as
`{"prompt": ..., "completion": ...}`, one line per choice. Off by default: the file keeps what
users send (docs/openai.md, Capture). No key or tenant is written."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


class Capture:
    """Appends exchanges to `path` (created 0600), one line each, whole lines only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def record(self, exchange: dict[str, Any] | None, texts: list[str]) -> None:
        """One line per answer text: `exchange` (the request's messages or prompt) with it;
        nothing for an empty text (`run sft` refuses an empty turn) or for a request that
        cannot be replayed as text (a prompt of token ids)."""
        if exchange is None:
            return
        lines = []
        for text in filter(None, texts):
            if "messages" in exchange:
                answer = {"role": "assistant", "content": text}
                line = {"messages": [*exchange["messages"], answer]}
            else:
                line = {"prompt": exchange["prompt"], "completion": text}
            lines.append(json.dumps(line, ensure_ascii=False) + "\n")
        if not lines:
            return
        data = "".join(lines).encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
