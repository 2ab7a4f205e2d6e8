"""A GGUF checkpoint of a Llama or a Qwen2 as a Hugging Face snapshot the embedded server serves.

    source = read_gguf(path)                  # checked: GGUF, complete, a served architecture
    snapshot = import_gguf(source, repo_id, cache, progress)

The snapshot is the layout `huggingface_hub` writes (`models--<owner>--<name>/refs/main`,
`snapshots/<revision>/`), its revision the first 40 hex digits of the file's sha256. It holds
the weights dequantised to float32 (`model.safetensors`, by transformers' GGUF loader), the
config, the tokenizer with its chat template (from the file's metadata) and a model card
(`README.md`) saying which file (its sha256) and which quantisation the weights came from.
It is written beside its place in the cache and moved there whole: an import that fails
leaves nothing. Needs the `hf` extra (transformers, gguf).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whitney.hf_cache import file_sha256
from whitney.local.hf_models import ARCHITECTURES

MAGIC = b"GGUF"
CARD_PREFIX = "whitney_"
"""The model card's front-matter keys this module writes (and `models list` reads)."""
Progress = Callable[[str], None]


class ModelImportError(Exception):
    """Why a file cannot be imported, in one line for the user."""


@dataclass(frozen=True)
class GGUFSource:
    """A checked GGUF file: what it is, from its metadata and tensor table."""

    path: Path
    sha256: str
    architecture: str
    name: str
    license: str | None
    quantization: str
    """The file type the metadata states (`general.file_type`), e.g. Q4_1, or the tensor
    types themselves when it states none."""
    tensor_types: dict[str, int]
    """How many tensors of each GGML type the file holds."""

    @property
    def revision(self) -> str:
        return self.sha256[:40]


def read_gguf(path: Path) -> GGUFSource:
    """The GGUF file at `path`, checked: ModelImportError if it is missing, not GGUF,
    truncated or corrupt, or of an architecture the embedded server does not serve."""
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as error:
        raise ModelImportError(f"cannot read {path}: {error.strerror or error}") from None
    if magic != MAGIC:
        raise ModelImportError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    reader = open_reader(path)
    architecture = field(reader, "general.architecture")
    if architecture not in ARCHITECTURES:
        raise ModelImportError(
            f"{path}: architecture {architecture!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    tensor_types = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    return GGUFSource(
        path=path,
        sha256=file_sha256(path),
        architecture=architecture,
        name=field(reader, "general.name") or path.stem,
        license=field(reader, "general.license"),
        quantization=quantization(field(reader, "general.file_type"), tensor_types),
        tensor_types=dict(tensor_types.most_common()),
    )


def open_reader(path: Path) -> Any:
    """gguf's reader of the file, every tensor's data checked to lie inside the file."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as error:  # the reader raises whatever its parse hits first
        raise ModelImportError(f"{path} is a truncated or corrupt GGUF file ({error})") from None
    size = path.stat().st_size
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > size or tensor.data.nbytes != tensor.n_bytes:
            raise ModelImportError(
                f"{path} is a truncated GGUF file (tensor {tensor.name} ends past its end)"
            )
    if not reader.tensors:
        raise ModelImportError(f"{path} is a GGUF file with no tensors")
    return reader


def field(reader: Any, key: str) -> Any:
    """A metadata value (a string or a number), None if the file has no such key."""
    found = reader.fields.get(key)
    return None if found is None else found.contents()


def quantization(file_type: int | None, tensor_types: Counter[str]) -> str:
    """The quantisation's name: the stated file type (MOSTLY_Q4_1 -> Q4_1), else the types
    of the tensors that are not float32, else F32."""
    from gguf import LlamaFileType

    if file_type is not None:
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    quantized = [name for name, _ in tensor_types.most_common() if name != "F32"]
    return "+".join(quantized) or "F32"


def default_repo_id(path: Path) -> str:
    """`gguf/<file name without .gguf, dots as dashes>`: an id that says where it came from."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", path.name.removesuffix(".gguf")).replace(".", "-")
    return f"gguf/{name.strip('-_') or 'model'}"


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def ensure_free(cache: Path, repo_id: str) -> Path:
    """The folder `repo_id` would take in `cache`; ModelImportError if it is taken."""
    target = repo_folder(cache, repo_id)
    if target.exists():
        raise ModelImportError(
            f"{repo_id} is already in {cache} (remove {target} or give another --name)"
        )
    return target


def import_gguf(source: GGUFSource, repo_id: str, cache: Path, progress: Progress) -> Path:
    """Write `source` as `repo_id`'s snapshot in `cache` (aside, then moved into place); its
    snapshot directory. ModelImportError if `repo_id` is already there, or transformers
    cannot read the file."""
    target = ensure_free(cache, repo_id)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=f".{target.name}.", suffix=".partial"))
    except OSError as error:
        raise ModelImportError(f"cannot write to {cache}: {error.strerror or error}") from None
    try:
        snapshot = staging / "snapshots" / source.revision
        write_snapshot(source, repo_id, snapshot, progress)
        (staging / "refs").mkdir()
        (staging / "refs" / "main").write_text(source.revision)
        os.chmod(staging, 0o755)
        os.replace(staging, target)
    except OSError as error:
        raise ModelImportError(f"cannot write to {cache}: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target / "snapshots" / source.revision


def write_snapshot(source: GGUFSource, repo_id: str, out: Path, progress: Progress) -> None:
    """Weights (float32 safetensors), config, tokenizer and model card of `source` in `out`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    directory, name = str(source.path.parent), source.path.name
    count = sum(source.tensor_types.values())
    progress(f"dequantising {count} tensors ({source.quantization}) to float32")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=torch.float32, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    except Exception as error:  # transformers' GGUF loader raises many kinds
        raise ModelImportError(f"{source.path}: transformers cannot read it ({error})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain float32 now
    config.name_or_path = repo_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    progress(f"writing the snapshot ({parameter_count(model) / 1e6:.1f}M parameters)")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(model_card(source, repo_id), encoding="utf-8")


def parameter_count(model: Any) -> int:
    """Distinct parameters (a tied head counted once)."""
    return sum(parameter.numel() for parameter in model.parameters())


def model_card(source: GGUFSource, repo_id: str) -> str:
    """The snapshot's README.md: where its weights came from, front matter first."""
    types = ", ".join(f"{kind} x{count}" for kind, count in source.tensor_types.items())
    license_line = f"license: {source.license}\n" if source.license else ""
    return (
        "---\n"
        f"{license_line}"
        "tags: [gguf, dequantized]\n"
        f"{CARD_PREFIX}source_file: {source.path.name}\n"
        f"{CARD_PREFIX}source_sha256: {source.sha256}\n"
        f"{CARD_PREFIX}quantization: {source.quantization}\n"
        "---\n\n"
        f"# {repo_id}\n\n"
        f"Dequantised to float32 by `whitney-flows models import` from the GGUF file "
        f"`{source.path.name}` (sha256 `{source.sha256}`), named {source.name!r} in its "
        f"metadata, a {source.architecture} quantised as {source.quantization} (tensors: "
        f"{types}).\n\n"
        "These are not the original weights: each is the float32 value of its quantised "
        "form, so the model computes what the quantised file does, not what the model it was "
        "quantised from did. The tokenizer and its chat template come from the file's "
        "metadata.\n"
    )


def card_fields(snapshot: Path) -> dict[str, str]:
    """The `whitney_*` front-matter fields of a snapshot's model card (without the prefix);
    empty if it has none (a checkpoint that was not imported)."""
    try:
        text = (snapshot / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    if not text.startswith("---\n"):
        return {}
    front = text[4:].partition("\n---")[0]
    fields = {}
    for line in front.splitlines():
        key, _, value = line.partition(":")
        if key.startswith(CARD_PREFIX):
            fields[key.removeprefix(CARD_PREFIX)] = value.strip()
    return fields
