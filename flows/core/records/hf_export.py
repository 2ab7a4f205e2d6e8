"""A Whitney export archive (whitney.local.engine.checkpoint.export_lora) as Hugging Face model
directories, offline: the base weights come from the archive, the tokenizer is built here.

    write_peft_dir(archive, out)     adapter_config.json, adapter_model.safetensors and a
                                     tokenizer at the top, the base model in out/base_model/
    write_merged_dir(archive, out)   one plain model directory, LoRA merged (by PEFT)

A `local/*` base model gets the byte tokenizer (whitney.tokenizers.ByteTokenizer): ids 0..255
are the UTF-8 bytes, then BOS, EOS, PAD and the spare id as special tokens, never parsed out of
text; encoding prepends BOS, as the flows' prompts do. A Hugging Face base (a repo id, plain or
`hf:`, or `hf:<dir>`) gets its own tokenizer, chat template included, from the local Hugging
Face cache or its directory, if it is there (never downloaded). The base model directory is a
Llama or a Qwen2, as the base was. Needs the `hf` extra (transformers, peft).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import warnings
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from whitney import hf_cache
from whitney.tokenizers import BOS_ID, EOS_ID, HF_PREFIX, LOCAL_PREFIX, PAD_ID, VOCAB_SIZE

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
BASE_DIR = "base_model"
BASE_FILES = (f"{BASE_DIR}/config.json", f"{BASE_DIR}/model.safetensors")
VALUE_HEAD = "value_head.safetensors"
SPECIAL_TOKENS = {"<s>": BOS_ID, "</s>": EOS_ID, "<pad>": PAD_ID, "<unused>": VOCAB_SIZE - 1}


class ArchiveError(ValueError):
    """The archive is not a Whitney PEFT export."""


def unpack(archive: Path, directory: Path) -> None:
    """The archive's known files into `directory` (no other name is written anywhere)."""
    wanted = {*ADAPTER_FILES, *BASE_FILES, VALUE_HEAD}
    found = set()
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                if member.name in wanted and member.isfile():
                    extract(tar, member, directory / member.name)
                    found.add(member.name)
    except tarfile.TarError:
        raise ArchiveError(f"{archive.name} is not a Whitney adapter export: not a tar") from None
    missing = sorted({*ADAPTER_FILES, *BASE_FILES} - found)
    if missing:
        raise ArchiveError(f"{archive.name} is not a Whitney adapter export: no {missing[0]}")


def extract(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tar.extractfile(member) as source, target.open("wb") as sink:  # type: ignore[union-attr]
        shutil.copyfileobj(source, sink)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character of every byte (the ByteLevel alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = (b for b in range(256) if b not in printable)
    mapping = {b: chr(b) for b in printable}
    mapping |= {b: chr(256 + n) for n, b in enumerate(extra)}
    return dict(sorted(mapping.items()))


def byte_tokenizer(max_length: int) -> Any:
    """ByteTokenizer as a transformers fast tokenizer: token id = byte value, BOS prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))  # ids 256.. in this order
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<unused>"],
        split_special_tokens=True,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def tokenizer_for(base_model: str, max_length: int) -> Any | None:
    """The base model's tokenizer, or None for a Hugging Face one missing from this machine."""
    if base_model.startswith(LOCAL_PREFIX):
        return byte_tokenizer(max_length)
    from transformers import AutoTokenizer

    source = base_model.removeprefix(HF_PREFIX)
    directory = Path(source) if source.startswith("/") else hf_cache.snapshot(source)
    if directory is None:
        return None
    try:
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError):
        return None


def finish_config(directory: Path, tokenizer: Any | None) -> None:
    """Name the tokenizer's BOS and PAD ids in config.json, and write generation_config.json."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(directory)
    if tokenizer is not None:
        config.bos_token_id = tokenizer.bos_token_id
        config.pad_token_id = tokenizer.pad_token_id
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)


def write_peft_dir(archive: Path, out: Path, home: Path | None = None) -> Path:
    """The PEFT adapter directory at `out` (a fresh directory), to be moved to `home` (default:
    it stays); `base_model_name_or_path` is the absolute path of home/base_model, so it loads
    from any working directory."""
    unpack(archive, out)
    config_path = out / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    base_model = adapter_config["base_model_name_or_path"]
    max_length = json.loads((out / BASE_FILES[0]).read_text())["max_position_embeddings"]
    tokenizer = tokenizer_for(base_model, max_length)
    finish_config(out / BASE_DIR, tokenizer)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
        tokenizer.save_pretrained(out / BASE_DIR)
    adapter_config["base_model_name_or_path"] = str(((home or out) / BASE_DIR).resolve())
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    return out


def write_merged_dir(archive: Path, out: Path) -> Path:
    """A plain model directory at `out` (a fresh directory): the base weights with the LoRA
    merged in by PEFT (`merge_and_unload`, in float64, then rounded once to float32), its
    config and the tokenizer."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with TemporaryDirectory(prefix="whitney-export-") as scratch:
        peft_dir = write_peft_dir(archive, Path(scratch) / "peft")
        base = AutoModelForCausalLM.from_pretrained(peft_dir / BASE_DIR, dtype=torch.float64)
        with warnings.catch_warnings():  # PEFT calls an API transformers deprecates
            warnings.simplefilter("ignore", FutureWarning)
            merged = PeftModel.from_pretrained(base, peft_dir).merge_and_unload()
        merged.to(torch.float32).save_pretrained(out)
        for path in peft_dir.iterdir():  # the tokenizer's files and a critic's value head
            if path.is_file() and path.name not in ADAPTER_FILES:
                shutil.copyfile(path, out / path.name)
    return out
