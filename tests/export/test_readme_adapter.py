"""README.md's "Use your adapter", run verbatim: its shell block (the two export commands, in
a new directory, RUN_ID naming a run that ended as a flow ends) and then its Python block,
offline (HF_HUB_OFFLINE=1), in fresh processes. The text the snippet prints is the server's
greedy `sample` (top_k 1) of the same prompt, decoded."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .helpers import BYTES, new_trained_run, prompt_tokens, server_greedy

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Use your adapter"


def section_blocks(language: str) -> list[str]:
    """The ```language blocks of the README's section, verbatim."""
    text = README.read_text()
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else None]
    return re.findall(rf"^```{language}\n(.*?)^```$", section, flags=re.DOTALL | re.MULTILINE)


def test_the_section_follows_the_quickstart():
    headings = re.findall(r"^## .*$", README.read_text(), flags=re.MULTILINE)
    assert headings[headings.index("## Quickstart") + 1] == SECTION


def test_the_readme_snippet_runs_verbatim(embedded_server, client, tmp_path):
    (shell,), (python,) = section_blocks("bash"), section_blocks("python")
    prompt = re.search(r'tokenizer\("([^"]*)"', python).group(1)
    max_new_tokens = int(re.search(r"max_new_tokens=(\d+)", python).group(1))
    run_id = new_trained_run(client)
    client.run_operation(run_id, "save_weights_for_sampler", {"name": "final"})
    greedy = server_greedy(client, run_id, "final", prompt_tokens(prompt), max_new_tokens)
    client.run_operation(run_id, "export_lora", {})
    client.finish(run_id)
    env = os.environ | {
        "RUN_ID": run_id,
        "WHITNEY_API_URL": embedded_server.url,
        "WHITNEY_API_KEY": embedded_server.api_key,
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    subprocess.run(["bash", "-euo", "pipefail", "-c", shell], cwd=tmp_path, env=env, check=True)
    printed = subprocess.run(
        [sys.executable, "-c", python],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert printed.strip() and printed == BYTES.decode(greedy) + "\n"
