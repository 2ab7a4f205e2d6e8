"""Settings of one embedded Whitney server, shared by the CLI and `EmbeddedWhitney`."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from whitney.hf_cache import cache_dir
from whitney.local.limits import Limits

API_KEYS_ENV = "WHITNEY_LOCAL_API_KEYS"
DEFAULT_GAP_TIMEOUT_S = 300.0
DEFAULT_POST_WAIT_S = 2.0
MAX_WAIT_S = 60.0
DEFAULT_SESSION_TTL_S = 300.0
"""A session's lease: closed by the server (its runs cancelled) after this long without a
heartbeat; 0 turns expiry off."""


def generate_api_key() -> str:
    """A fresh random API key (URL-safe, 32 bytes of entropy)."""
    return "wl-" + secrets.token_urlsafe(32)


def api_keys_from_env(environ: dict[str, str] | None = None) -> list[str]:
    """The comma-separated keys of WHITNEY_LOCAL_API_KEYS, blanks dropped."""
    raw = (environ if environ is not None else os.environ).get(API_KEYS_ENV, "")
    return [key.strip() for key in raw.split(",") if key.strip()]


def api_keys_from_file(path: Path) -> list[str]:
    """The keys of a keys file: one a line; blank lines and `#` comments skipped. OSError if
    it cannot be read, ValueError if it holds no key."""
    lines = path.read_text(encoding="utf-8").splitlines()
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"{path} holds no API key (one a line)")
    return keys


def default_data_dir() -> Path:
    """The user's data directory for the embedded server: $XDG_DATA_HOME/whitney-flows/local."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return Path(base) / "whitney-flows" / "local"


@dataclass
class ServerConfig:
    """Everything the server needs; the fault knobs are off by default."""

    data_dir: Path
    api_keys: list[str] = field(default_factory=list)
    latency_ms: float = 0.0
    fail_before_rate: float = 0.0
    drop_after_commit_rate: float = 0.0
    fault_seed: int = 0
    gap_timeout_s: float = DEFAULT_GAP_TIMEOUT_S
    post_wait_s: float = DEFAULT_POST_WAIT_S
    limits: Limits = field(default_factory=Limits)
    session_ttl_s: float = DEFAULT_SESSION_TTL_S
    hf_dirs: tuple[Path, ...] = ()
    """Directories an `hf:<path>` base model may be loaded from (`serve --hf-dir`); besides
    them, `hf:<repo id>` resolves only from the local Hugging Face cache."""
    capture: Path | None = None
    """`serve --capture FILE`: the JSONL file the OpenAI-compatible routes append each
    exchange to (`whitney.local.capture`); None, the default, keeps nothing."""
    tinker_url: str | None = None
    """`serve --tinker-url URL`: runs of provider `tinker` execute on that Tinker endpoint
    through the official SDK (`whitney.local.tinker_provider`), the key from the SDK's
    TINKER_API_KEY; None, the default, runs them on the CPU engine under Tinker's rules."""
    hf_cache: Path = field(default_factory=cache_dir)
    """The Hugging Face cache whose Llama and Qwen2 checkpoints are served by repo id
    (`serve --hf-cache`; default: $HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub, when the server starts)."""

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        self.hf_cache = Path(self.hf_cache)
        if not self.api_keys:
            raise ValueError("at least one API key is required")
        for name in ("fail_before_rate", "drop_after_commit_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")
        if self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if self.gap_timeout_s <= 0:
            raise ValueError(f"gap_timeout_s must be > 0, got {self.gap_timeout_s}")
        if self.post_wait_s < 0:
            raise ValueError(f"post_wait_s must be >= 0, got {self.post_wait_s}")
        if not 0 <= self.session_ttl_s < float("inf"):
            raise ValueError(f"session_ttl_s must be >= 0, got {self.session_ttl_s}")
