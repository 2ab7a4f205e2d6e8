"""The `models` command of `whitney-flows`: the Hugging Face checkpoints the embedded server
serves, and how to add one with no hub.

    whitney-flows models import FILE.gguf [--name ID] [--hf-cache DIR]
    whitney-flows models pull NAME [--name ID] [--hf-cache DIR]
    whitney-flows models list [--hf-cache DIR]

`import` turns a Llama or Qwen2 GGUF file into a float32 snapshot (whitney.local.gguf_import);
`pull` downloads a model it knows by name with pip and imports it (whitney.local.model_pull);
`list` shows the cache's served checkpoints: id, architecture, parameters, size, origin. The
cache is `--hf-cache`, else the environment's (whitney.hf_cache), the one the server
`whitney-flows run` starts reads. No Prefect import.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
from math import prod
from pathlib import Path

from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_OK
from whitney import hf_cache
from whitney.local import hf_models
from whitney.local.gguf_import import (
    ModelImportError,
    card_fields,
    default_repo_id,
    ensure_free,
    import_gguf,
    read_gguf,
    repo_folder,
)
from whitney.local.model_pull import PULLABLE, fetch_gguf

HF_EXTRA = 'importing a GGUF file needs the hf extra: pip install "whitney-flows[hf]"'


def run_models(options: argparse.Namespace) -> int:
    """`models import|pull|list`; the exit code."""
    cache = options.hf_cache or hf_cache.cache_dir()
    if options.models_command == "list":
        print_models(cache)
        return EXIT_OK
    try:
        if options.name is not None and not hf_cache.is_repo_id(options.name):
            raise ModelImportError(f"--name {options.name!r} is not a repo id (owner/name)")
        if options.models_command == "import":
            snapshot, repo_id = import_file(options.file, options.name, cache)
        else:
            snapshot, repo_id = pull(options.model, options.name, cache)
    except ModelImportError as error:
        print(f"whitney-flows models {options.models_command}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(f"{repo_id} is in {snapshot}: --base-model {repo_id} trains it on the embedded server")
    return EXIT_OK


def progress(message: str) -> None:
    print(f"whitney-flows models: {message}", file=sys.stderr, flush=True)


def check_hf_extra() -> None:
    """ModelImportError naming the `hf` extra if its packages are missing."""
    try:
        import gguf  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ModelImportError(HF_EXTRA) from None


def import_file(path: Path, name: str | None, cache: Path) -> tuple[Path, str]:
    """Import the GGUF file at `path` as `name` (default: from its file name)."""
    check_hf_extra()
    source = read_gguf(path)
    repo_id = name or default_repo_id(path)
    ensure_free(cache, repo_id)
    progress(f"importing {path.name} ({source.architecture}, {source.quantization}) as {repo_id}")
    return import_gguf(source, repo_id, cache, progress), repo_id


def pull(model: str, name: str | None, cache: Path) -> tuple[Path, str]:
    """Download the model `pull` knows as `model` and import it; an id already imported from
    the same file is left as it is."""
    pinned = PULLABLE.get(model)
    if pinned is None:
        raise ModelImportError(f"unknown model {model!r} (known: {', '.join(PULLABLE)})")
    repo_id = name or pinned.repo_id
    snapshot = hf_cache.snapshot(repo_id, cache)
    if snapshot is not None and card_fields(snapshot).get("source_sha256") == pinned.sha256:
        progress(f"{repo_id} is already imported from the pinned file")
        return snapshot, repo_id
    if repo_folder(cache, repo_id).exists():
        raise ModelImportError(f"{repo_id} is already in {cache} and is not {model}")
    check_hf_extra()
    with tempfile.TemporaryDirectory(prefix="whitney-pull-") as scratch:
        path = fetch_gguf(pinned, Path(scratch), progress)
        source = read_gguf(path)
        progress(f"importing {path.name} ({source.quantization}) as {repo_id}")
        return import_gguf(source, repo_id, cache, progress), repo_id


def print_models(cache: Path) -> None:
    """The served checkpoints of `cache`, one line each (or where none are)."""
    repo_ids = hf_models.served_repo_ids(cache)
    if not repo_ids:
        print(f"no checkpoint the embedded server serves in {cache}")
        return
    rows = [("ID", "ARCHITECTURE", "PARAMETERS", "SIZE", "ORIGIN")]
    for repo_id in repo_ids:
        snapshot = hf_cache.snapshot(repo_id, cache)
        assert snapshot is not None  # served_repo_ids lists snapshots only
        config = hf_models.read_config(snapshot) or {}
        rows.append(
            (
                repo_id,
                str(config.get("model_type")),
                f"{parameters(snapshot) / 1e6:.1f}M",
                f"{size(snapshot) / 1e6:.0f} MB",
                origin(snapshot),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())
    print(f"(Hugging Face cache: {cache})")


def parameters(snapshot: Path) -> int:
    """The parameters in the snapshot's safetensors files, from their headers."""
    total = 0
    for path in snapshot.glob("*.safetensors"):
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        total += sum(prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
    return total


def size(snapshot: Path) -> int:
    """The bytes of the snapshot's files (a hub cache's links followed)."""
    return sum(path.stat().st_size for path in snapshot.iterdir() if path.is_file())


def origin(snapshot: Path) -> str:
    """Where the weights came from: the GGUF file an import names in its model card, else
    the Hugging Face hub if the files are links into the cache's blobs (as `hf download`
    writes them)."""
    card = card_fields(snapshot)
    if not card:
        linked = any(path.is_symlink() for path in snapshot.glob("*.safetensors"))
        return "Hugging Face hub" if linked else "unknown (no import model card)"
    return (
        f"dequantised from {card.get('source_file')} ({card.get('quantization')}, "
        f"sha256 {card.get('source_sha256', '')[:12]})"
    )
