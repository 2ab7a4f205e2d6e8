"""What every flow's configuration shares (`FlowConfig`, `ConfigError`, the budget and price
fields): pydantic models whose field descriptions and bounds become the Prefect UI's run
form, and the loading of a config file (TOML or JSON).

No field ever holds the Whitney API key: it comes from WHITNEY_API_KEY (or, later, a block),
because flow parameters are stored and shown by Prefect.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flows.core.evaluation.config import EvalSettings
from flows.core.fields import EveryCycles, LearningRate, LoraRank, NonEmpty, Seed
from flows.core.loop.cost import Budget, PriceTable
from flows.core.loop.stall_windows import StallSettings
from flows.core.records.tracking.config import TrackingSettings
from flows.core.renames import RenamedFields
from tasks.names import CYCLE_CHECKPOINT_PATTERN, checkpoint_cycle
from tasks.retry import TaskRetrySettings
from whitney.renderers import RendererName
from whitney.wire import Provider

ConfigT = TypeVar("ConfigT", bound=BaseModel)
BudgetField = Annotated[
    Budget,
    Field(
        default_factory=Budget,
        description="Stop cleanly (save_state, export, finish, close) before the cycle that "
        "would exceed max_tokens or max_cost",
    ),
]
"""A flow's `budget` field (the flows with a cost estimate: RL, distillation)."""
PricesField = Annotated[
    PriceTable | None,
    Field(
        default=None,
        description="USD per million sampled / prefilled / trained tokens, for the cost "
        "estimate; empty: the credentials block's price table, if any",
    ),
]
"""A flow's `prices` field, beside its `budget`."""


ApiUrlField = Annotated[
    str | None,
    Field(
        default=None,
        description="Whitney base URL; empty: the WHITNEY_API_URL environment variable. "
        "The API key always comes from WHITNEY_API_KEY (or the block), never a parameter.",
    ),
]
"""The `api_url` field of every flow that calls Whitney (the training and checkpoint flows)."""
TaskRetryField = Annotated[
    TaskRetrySettings,
    Field(
        default_factory=TaskRetrySettings,
        description="Retries of each Whitney task (only retryable errors)",
    ),
]
"""The `task_retry` field, beside `api_url`."""
CleanupTimeoutField = Annotated[
    float,
    Field(default=60.0, gt=0, le=3600, description="How long cleanup waits for a run to end"),
]
"""The `cleanup_timeout_s` field, beside `api_url`."""


MaxStalenessField = Annotated[
    int,
    Field(
        default=0,
        ge=0,
        le=16,
        description="Off-policy steps: cycle n samples from the weights after optimizer step "
        "max(k, n - max_staleness), k the cycle after the latest checkpoint, so the sampling of "
        "the next cycles runs while the current one trains (the same adapter on every run); "
        "0: on-policy",
    ),
]
"""A flow's `max_staleness` field (the flows that sample: RL, distillation's student)."""


def check_max_staleness(max_staleness: int, **needed: bool) -> None:
    """ConfigError unless every setting in `needed` is true when `max_staleness` > 0."""
    for name, value in needed.items():
        if max_staleness > 0 and not value:
            raise ConfigError(
                "max_staleness",
                f"sampling ahead needs {name} = true (the later cycles' samples are requested "
                "together, on samplers named before they exist)",
            )


CheckpointEvery = Annotated[
    EveryCycles,
    Field(
        description="save_state named cycle-{n} after every this many cycles: where a retried "
        "flow run resumes (0: only the final checkpoint)"
    ),
]
"""A flow config's `checkpoint_every` field; the flow gives its default."""


class ConfigError(ValueError):
    """A configuration the flow refuses before anything is allocated; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class FlowConfig(RenamedFields):
    """What every Whitney training flow shares: where, on what, and how it retries and cleans up."""

    model_config = ConfigDict(extra="forbid")

    api_url: ApiUrlField
    provider: Provider = Field(default="local", description="Whitney provider that trains the run")
    base_model: NonEmpty = Field(
        default="local/tiny",
        description="Base model: any name the provider's capabilities list (local/nano, "
        "local/tiny, local/small on the embedded server, or a Hugging Face repo id such as "
        "Qwen/Qwen2.5-0.5B-Instruct)",
    )
    tokenizer: NonEmpty | None = Field(
        default=None,
        description="The tokenizer: a Hugging Face repo id or a local directory; empty: the "
        "base model's own (bytes for local/*, else its Hugging Face tokenizer)",
    )
    renderer: RendererName = Field(
        default="auto",
        description="How messages become tokens: raw (text, no markup), chat_template (the "
        "tokenizer's own), llama3, qwen; auto: raw for local/*, else the chat template if the "
        "tokenizer has one, else raw",
    )
    lora_rank: LoraRank = Field(default=8, description="LoRA rank of the trained adapter")
    seed: Seed = Field(default=0, description="Seed of the run, prompts and sampling")
    cycles: int = Field(default=30, ge=1, le=100_000, description="Number of training cycles")
    learning_rate: LearningRate = 2e-3
    grad_clip_norm: float = Field(
        default=1.0, ge=0, description="Clip the global gradient norm to this (0: off)"
    )
    metrics_path: str | None = Field(
        default=None, description="Append one JSON line of metrics per cycle to this file"
    )
    task_retry: TaskRetryField
    cycle_retries: int = Field(
        default=2, ge=0, le=20, description="Retries of a failed cycle subflow (it replays)"
    )
    cycle_retry_delay_s: float = Field(
        default=0.0, ge=0, le=3600, description="Delay before a cycle subflow retry"
    )
    cleanup_timeout_s: CleanupTimeoutField
    checkpoint_every: CheckpointEvery = 10
    resume_from: str | None = Field(
        default=None,
        pattern=CYCLE_CHECKPOINT_PATTERN,
        description="Continue from this checkpoint (whitney://runs/<run>/states/cycle-<n>, "
        "from any earlier flow run) on a new run, at cycle n+1: a fork, with the settings "
        "changed here recorded as its lineage (provider, base_model, lora_rank and tokenizer "
        "cannot change)",
    )
    stall: StallSettings = Field(
        default_factory=StallSettings,
        description="The stall automations (deployments/automations.yaml) cancel the flow run "
        "when a cycle runs `multiple` times the recent cycle time without completing",
    )
    tracking: TrackingSettings = Field(
        default_factory=TrackingSettings,
        description="Experiment trackers (MLflow, TensorBoard, Weights & Biases) the run's "
        "params, per-cycle metrics, evaluations, learning curves and exported adapter go to",
    )

    def eval_settings(self) -> EvalSettings | None:
        """What an evaluation of this flow's checkpoints samples (None: nothing to evaluate);
        every `whitney.checkpoint.saved` event carries it."""
        return None

    def evaluation(self, **sampling: Any) -> EvalSettings:
        """The eval settings `sampling` (which prompts, how many samples, how long) with
        training's seed, tokenizer and renderer: what `eval_settings` returns."""
        return EvalSettings(
            **sampling, seed=self.seed, tokenizer=self.tokenizer, renderer=self.renderer
        )

    def served_models(self) -> dict[str, str]:
        """The base models the flow trains or scores, by the field that names them (checked
        against the provider's capabilities before a session opens)."""
        return {"base_model": self.base_model}


def checkpoint_due(cycle: int, every: int, cycles: int) -> bool:
    """Whether cycle `cycle` ends with a `cycle-{n}` checkpoint: after every `every` cycles,
    except the flow's last cycle, whose state the final save_state keeps under that name."""
    return every > 0 and (cycle + 1) % every == 0 and cycle < cycles - 1


def check_resume_from(resume_from: str | None, cycles: int) -> None:
    """ConfigError unless `resume_from` is empty or a cycle checkpoint that leaves cycles
    to train (before anything is allocated)."""
    if not resume_from:
        return
    try:
        cycle = checkpoint_cycle(resume_from)
    except ValueError as error:
        raise ConfigError("resume_from", str(error)) from None
    if cycle + 1 >= cycles:
        raise ConfigError(
            "resume_from",
            f"{resume_from} is the state after cycle {cycle}: nothing is left to train with "
            f"cycles={cycles} (cycles counts from cycle 0; set it above {cycle + 1})",
        )


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a .toml or .json config file; ConfigError naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError("--config", f"cannot read {path}: {error.strerror}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError("--config", f"{path}: expected a .toml or .json file")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ConfigError("--config", f"{path} is not valid {path.suffix[1:]}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError("--config", f"{path} must hold a table/object of settings")
    return data


def settings_with_overrides(path: Path | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The config file's settings (none without a file), with the overrides that are set
    (not None) on top: the command line's options over the file; an override that is a table
    goes over the file's table of the same name, setting by setting."""
    data = read_config_file(path) if path else {}
    for name, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(name), dict):
            data[name] = {**data[name], **value}
        elif value is not None:
            data[name] = value
    return data


def validated(model: type[ConfigT], data: dict[str, Any]) -> ConfigT:
    """`model` built from `data`; ConfigError naming the first refused field otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"]) or "(config)"
        raise ConfigError(field, first["msg"]) from None
