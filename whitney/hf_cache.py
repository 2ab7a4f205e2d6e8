"""Where Hugging Face models are on this machine: the hub cache and a repo id's snapshot in it.

The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, read when
asked (not when a module is imported, as huggingface_hub does), so the flows, the export and
the embedded server find the same files. A repo id's snapshot is the directory
`models--<owner>--<name>/snapshots/<revision>` whose revision `refs/main` names: the layout
`huggingface_hub` writes. Plain file reads; no torch, no network.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
"""A Hugging Face repo id as a provider names a base model: `owner/name`."""
OFFLINE_VALUES = frozenset({"1", "ON", "YES", "TRUE"})


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (weights, a GGUF file, an archive), read in 8 MiB blocks:
    the project's one file hash."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def cache_dir() -> Path:
    """The Hugging Face hub cache of this environment."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    """Whether downloads are off (`HF_HUB_OFFLINE`)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in OFFLINE_VALUES


def is_repo_id(name: str) -> bool:
    """`owner/name`, with no `..` (so it never leaves the cache directory)."""
    return bool(REPO_ID.match(name)) and ".." not in name


def snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The directory of `repo_id`'s main revision in the cache, or None if it is not there."""
    if not is_repo_id(repo_id):
        return None
    folder = (cache or cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    try:
        revision = (folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = folder / "snapshots" / revision
    return path if revision and "/" not in revision and path.is_dir() else None


def cached_repo_ids(cache: Path | None = None) -> list[str]:
    """The repo ids with a main snapshot in the cache, sorted."""
    root = cache or cache_dir()
    try:
        folders = [entry.name for entry in root.iterdir() if entry.name.startswith("models--")]
    except OSError:
        return []
    repo_ids = []
    for folder in folders:
        parts = folder.removeprefix("models--").split("--")
        if len(parts) == 2 and snapshot("/".join(parts), root) is not None:
            repo_ids.append("/".join(parts))
    return sorted(repo_ids)
