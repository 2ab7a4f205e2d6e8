"""Every check the engine makes of a request's fields, before any work: plain JSON in, typed
plain values out, which `runtime` turns into tensors. Request limits belong here too."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from whitney.errors import InvalidDatum, InvalidLossConfig, InvalidRequest, UnsupportedLoss
from whitney.losses import LOSS_FUNCTIONS, REQUIRED_LOSS_INPUTS

if TYPE_CHECKING:
    from whitney.local.engine.model import ModelConfig

ROLES = ("policy", "critic")
CRITIC_LOSSES = ("ppo_critic", "ppo")  # on a critic run, ppo is routed to the critic loss
POLICY_LOSSES = frozenset(LOSS_FUNCTIONS) - {"ppo_critic"}
"""The losses a policy run serves: `engine.losses.POLICY` implements each."""
FLOAT_INPUTS = (
    "weights",
    "logprobs",
    "advantages",
    "clip_low_threshold",
    "clip_high_threshold",
    "sequence_ratio_mask",
    "values",
    "returns",
)
LOSS_INPUTS = ("target_tokens", *FLOAT_INPUTS)
"""Every loss_inputs tensor some loss reads; any other name is refused."""
MAX_LEARNING_RATE = 10.0
"""An AdamW step moves each weight by about the learning rate: past this, only garbage (and
soon non-finite weights) can come out."""
MIN_TEMPERATURE = 1e-3
"""Below this (0 aside, which is greedy), logits / temperature overflow float32."""
MIN_TOP_P = 1e-6
"""Below this, top_p rounds towards float32 0, which keeps no token at all."""
LOSS_CONFIG_DEFAULTS: dict[str, dict[str, float]] = {
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 0.05},
    "gspo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dppo": {"delta_low": 0.2, "delta_high": 0.2},
    "ppo_critic": {"value_clip": 0.2},
}
"""The docs/losses.md defaults of each loss's scalar loss_config keys (those the engine reads)."""
OPTIMIZER_DEFAULTS = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-8,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}


@dataclass(frozen=True)
class Datum:
    """One checked datum: its tokens and the loss inputs the engine reads (floats as float32)."""

    token_ids: list[int]
    target_tokens: list[int] | None
    floats: dict[str, list[float]]


@dataclass(frozen=True)
class ForwardRequest:
    """A checked forward payload: the loss to run, its datums, its loss_config with defaults."""

    loss: str
    data: list[Datum]
    config: dict[str, float]


@dataclass(frozen=True)
class SamplingParams:
    """A SampleRequest's sampling_params; temperature 0 means greedy (top_k = 1)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class SampleSpec:
    """One validated SampleRequest."""

    prompt: list[int]
    num_samples: int
    params: SamplingParams
    seed: int


def check_request(kind: str, payload: dict[str, Any], role: str, cfg: ModelConfig) -> None:
    """Every check of a `kind` payload the engine makes when it runs it, made before it is
    journaled (a refusal then uses up no seq_id)."""
    if kind in ("forward", "forward_backward"):
        forward_request(payload, role, cfg)
    elif kind == "optim_step":
        hyperparameters(payload.get("optimizer") or {})
    elif kind == "sample":
        sample_spec(payload, 0, cfg)
    elif kind == "logprobs":
        logprobs_sequences(payload, cfg)


def check_run(role: str, lora_rank: int) -> None:
    """A new run's role and LoRA rank."""
    if role not in ROLES:
        raise InvalidRequest(f"role {role!r}: expected 'policy' or 'critic'")
    if lora_rank < 1:
        raise InvalidRequest(f"lora_rank must be >= 1, got {lora_rank}")


def forward_request(payload: dict[str, Any], role: str, cfg: ModelConfig) -> ForwardRequest:
    """A forward / forward_backward payload on a run of `role`: its loss, datums, loss_config."""
    loss = payload.get("loss_function")
    if role == "critic":
        if loss not in CRITIC_LOSSES:
            raise UnsupportedLoss(
                f"loss_function {loss!r}: a critic run trains ppo_critic (or ppo)"
            )
        loss = "ppo_critic"
    elif loss not in POLICY_LOSSES:
        why = "needs a critic run" if loss == "ppo_critic" else "is not a known loss"
        raise UnsupportedLoss(f"loss_function {loss!r} {why}")
    data = datums(payload.get("data") or [], REQUIRED_LOSS_INPUTS[loss], cfg)
    return ForwardRequest(loss, data, loss_config(loss, payload.get("loss_config") or {}))


def datums(data: list[dict[str, Any]], required: tuple[str, ...], cfg: ModelConfig) -> list[Datum]:
    """Each datum's shape first (tokens, required inputs, lengths), then each input's values."""
    if not data:
        raise InvalidDatum("data is empty: at least one datum is required")
    for i, datum in enumerate(data):
        ids = datum.get("input", {}).get("token_ids")
        if not isinstance(ids, list) or not 0 < len(ids) <= cfg.max_positions:
            raise _datum_error(
                f"data[{i}].input.token_ids must hold 1..{cfg.max_positions} tokens", i, "token_ids"
            )
        if not _token_ids(ids, cfg):
            raise _datum_error(
                f"data[{i}].input.token_ids: ids must be in [0, {cfg.vocab_size})", i, "token_ids"
            )
        loss_inputs = datum.get("loss_inputs", {})
        for name in loss_inputs:
            if name not in LOSS_INPUTS:
                raise _datum_error(
                    f"data[{i}].loss_inputs.{name} is not a tensor any loss reads "
                    f"(known: {', '.join(LOSS_INPUTS)})",
                    i,
                    name,
                )
        for name in required:
            if name not in loss_inputs:
                raise _datum_error(
                    f"data[{i}].loss_inputs.{name} is required by this loss", i, name
                )
        for name, tensor in loss_inputs.items():
            values = tensor.get("values") if isinstance(tensor, dict) else None
            if not isinstance(values, list) or len(values) != len(ids):
                raise _datum_error(
                    f"data[{i}].loss_inputs.{name} must have {len(ids)} values", i, name
                )
    return [_datum(i, datum, cfg) for i, datum in enumerate(data)]


def _datum(i: int, datum: dict[str, Any], cfg: ModelConfig) -> Datum:
    """A datum of checked shape with its values checked: integer targets in the vocabulary,
    finite float32 inputs."""
    targets = None
    floats: dict[str, list[float]] = {}
    for name, tensor in datum.get("loss_inputs", {}).items():
        values = tensor["values"]
        if name == "target_tokens":
            _check_numbers(values, i, name, integers=True)
            if not _token_ids(values, cfg):
                raise _datum_error(
                    f"data[{i}].loss_inputs.target_tokens out of vocabulary", i, name
                )
            targets = values
        elif name in FLOAT_INPUTS:
            _check_numbers(values, i, name, integers=False)
            as_float32 = array("f", values).tolist()
            if not all(math.isfinite(v) for v in as_float32):
                raise _datum_error(f"data[{i}].loss_inputs.{name} has a non-finite value", i, name)
            floats[name] = as_float32
    return Datum(datum["input"]["token_ids"], targets, floats)


def _check_numbers(values: list[Any], index: int, name: str, *, integers: bool) -> None:
    if not all(_is_number(v) for v in values):
        raise _datum_error(f"data[{index}].loss_inputs.{name} must hold numbers", index, name)
    if integers and not all(isinstance(v, int) for v in values):
        raise _datum_error(f"data[{index}].loss_inputs.{name} must hold integers", index, name)


def _is_number(value: Any) -> bool:
    """A JSON number: an int or a float, never a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _datum_error(message: str, index: int, tensor: str) -> InvalidDatum:
    return InvalidDatum(message, details={"datum": index, "tensor": tensor})


def loss_config(loss: str, config: dict[str, Any]) -> dict[str, float]:
    """The scalar loss_config values `loss` reads, each given or its docs/losses.md default."""
    values = {}
    for key, default in LOSS_CONFIG_DEFAULTS.get(loss, {}).items():
        value = config.get(key, default)
        if not _is_number(value) or value != value:
            raise InvalidLossConfig(f"loss_config.{key} must be a number, got {value!r}")
        values[key] = float(value)
    return values


def hyperparameters(optimizer: dict[str, Any]) -> dict[str, float]:
    """The Optimizer payload with defaults filled in, validated."""
    if optimizer.get("type", "adamw") != "adamw":
        raise _refused("optimizer.type", f"optimizer.type {optimizer.get('type')!r}: only adamw")
    hp = {}
    for key, default in OPTIMIZER_DEFAULTS.items():
        value = optimizer.get(key, default)
        if not _is_number(value) or not math.isfinite(value):
            raise _refused(f"optimizer.{key}", f"optimizer.{key} must be a finite number")
        hp[key] = float(value)
    if hp["learning_rate"] < 0 or hp["eps"] <= 0 or hp["grad_clip_norm"] < 0:
        raise _refused("optimizer", "optimizer: learning_rate, eps, grad_clip_norm < 0")
    if hp["learning_rate"] > MAX_LEARNING_RATE:
        raise _refused(
            "optimizer.learning_rate",
            f"optimizer.learning_rate: {hp['learning_rate']:g} is over {MAX_LEARNING_RATE:g}, "
            "which can only produce non-finite weights",
        )
    if not (0 <= hp["beta1"] < 1 and 0 <= hp["beta2"] < 1):
        raise _refused("optimizer", "optimizer: beta1 and beta2 must be in [0, 1)")
    return hp


def sample_spec(request: dict[str, Any], default_seed: int, cfg: ModelConfig) -> SampleSpec:
    """A SampleRequest; a null seed is `default_seed`."""
    prompt = (request.get("prompt") or {}).get("token_ids")
    sp = request.get("sampling_params") or {}
    n = request.get("num_samples", 1)
    max_tokens = sp.get("max_tokens")
    if not isinstance(prompt, list) or not prompt or not _token_ids(prompt, cfg):
        raise _refused("prompt.token_ids", f"prompt.token_ids: 1+ ids in [0, {cfg.vocab_size})")
    if not isinstance(n, int) or n < 1:
        raise _refused("num_samples", "num_samples must be a positive integer")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise _refused("sampling_params.max_tokens", "sampling_params.max_tokens must be >= 1")
    if len(prompt) + max_tokens > cfg.max_positions:
        raise _refused(
            "sampling_params.max_tokens",
            f"prompt + max_tokens exceeds the model's {cfg.max_positions} positions",
        )
    temperature = float(sp.get("temperature", 1.0))
    top_p = float(sp.get("top_p", 1.0))
    top_k = sp.get("top_k")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise _refused("sampling_params.temperature", "sampling_params.temperature must be >= 0")
    if 0 < temperature < MIN_TEMPERATURE:
        raise _refused(
            "sampling_params.temperature",
            f"sampling_params.temperature: {temperature:g} is under {MIN_TEMPERATURE:g} (use "
            "top_k 1 for greedy decoding): logits / temperature would overflow",
        )
    if not MIN_TOP_P <= top_p <= 1:
        raise _refused(
            "sampling_params.top_p",
            f"sampling_params.top_p must be in [{MIN_TOP_P:g}, 1] (use top_k 1 for greedy)",
        )
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise _refused("sampling_params.top_k", "sampling_params.top_k must be null or >= 1")
    stops = sp.get("stop_token_ids") or []
    if not all(isinstance(t, int) for t in stops):
        raise _refused(
            "sampling_params.stop_token_ids", "sampling_params.stop_token_ids must be integers"
        )
    seed = sp.get("seed")
    params = SamplingParams(max_tokens, temperature, top_p, top_k, tuple(stops))
    return SampleSpec(prompt, n, params, default_seed if seed is None else int(seed))


def logprobs_sequences(request: dict[str, Any], cfg: ModelConfig) -> list[list[int]]:
    """A LogprobsRequest's sequences of token ids."""
    sequences = [s.get("token_ids") for s in request.get("sequences") or []]
    for i, ids in enumerate(sequences):
        if (
            not isinstance(ids, list)
            or not 0 < len(ids) <= cfg.max_positions
            or not _token_ids(ids, cfg)
        ):
            raise _refused(
                f"sequences[{i}].token_ids",
                f"sequences[{i}].token_ids: 1..{cfg.max_positions} ids in [0, {cfg.vocab_size})",
            )
    return sequences


def _refused(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, details={"field": field})


def _token_ids(ids: list[Any], cfg: ModelConfig) -> bool:
    """Every id an int in the model's vocabulary."""
    return all(isinstance(t, int) and 0 <= t < cfg.vocab_size for t in ids)
