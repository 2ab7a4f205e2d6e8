"""Tinker's request and result shapes, to and from Whitney's operation payloads and results.

Pure functions: each refusal is a `whitney.errors` error naming the Tinker field, and what the
engine does not have is named as not served.
"""

from __future__ import annotations

from typing import Any

from whitney.errors import InvalidRequest
from whitney.local.tinker.proto import ForwardBackwardIn, ProtoError

TINKER_SCHEME = "tinker://"
CLIP_KEYS = frozenset({"clip_low_threshold", "clip_high_threshold"})
"""`loss_fn_config` keys the route turns into the per-token tensors of the same names (the
`tinker` provider's form of the same clip range)."""
ADVANTAGE_LOSSES = frozenset({"importance_sampling", "ppo", "cispo"})
"""Losses whose every term is a multiple of the token's advantage (Tinker's have no weights):
a datum without `weights` is weighted where it carries a sample (`sampled_weights`), which
leaves the loss and gradient as they are and keeps its unsampled positions out of the metrics
(`tokens:sum`, `kl_sample_train:mean`, `clip_fraction:mean`)."""
SESSION_SEPARATOR = "~"
"""A sampling session id is `<run_id>~<sampler_id>`: the run's sampler it samples."""


def refused(field: str, what: str) -> InvalidRequest:
    """400 naming a Tinker feature the embedded server does not serve."""
    return InvalidRequest(
        f"{field}: {what} is not served by the embedded Whitney server",
        details={"field": field, "not_served": what},
    )


def bad(field: str, reason: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {reason}", details={"field": field})


def forward_payload(request: ForwardBackwardIn) -> tuple[str, dict[str, Any]]:
    """The Whitney operation (`forward` or `forward_backward`) of a decoded request."""
    if not request.data:
        raise bad("data", "must hold at least one datum")
    if request.loss_fn == "custom":
        raise refused("loss_fn", "a server-side custom loss ('custom')")
    config: dict[str, float] = {}
    for key, value in request.loss_fn_config.items():
        if isinstance(value, str):
            raise bad(f"loss_fn_config.{key}", "text values are not served (numbers only)")
        config[key] = value
    data = []
    for index, datum in enumerate(request.data):
        where = f"data[{index}]"
        if datum.refused is not None:
            raise refused(f"{where}.model_input", datum.refused)
        inputs: dict[str, Any] = {}
        for name, tensor in datum.loss_fn_inputs.items():
            field = f"{where}.loss_fn_inputs.{name}"
            try:
                values = tensor.values(field)
            except ProtoError as exc:
                raise bad(exc.field, str(exc).split(": ", 1)[1]) from None
            if len(tensor.shape) > 1:
                raise refused(field, f"a tensor of shape {tensor.shape} (1-D tensors only)")
            dtype = "float32" if tensor.dtype == 1 else "int64"
            inputs[name] = {"dtype": dtype, "shape": [len(values)], "values": values}
        weights = sampled_weights(inputs) if request.loss_fn in ADVANTAGE_LOSSES else None
        if weights is not None:
            inputs["weights"] = {"dtype": "float32", "shape": [len(weights)], "values": weights}
        for key in CLIP_KEYS & config.keys():  # Tinker's scalar clip: a tensor per token here
            values = [config[key]] * len(datum.tokens)
            inputs[key] = {"dtype": "float32", "shape": [len(values)], "values": values}
        data.append({"input": {"token_ids": datum.tokens}, "loss_inputs": inputs})
    config = {key: value for key, value in config.items() if key not in CLIP_KEYS}
    payload = {"data": data, "loss_function": request.loss_fn, "loss_config": config}
    return ("forward" if request.forward_only else "forward_backward"), payload


def sampled_weights(inputs: dict[str, Any]) -> list[float] | None:
    """For a datum without `weights`: 1 where a position carries a sampled token (a nonzero
    advantage or sampler logprob), 0 where both are 0, as at the prompt positions a cookbook
    RL datum pads (its `mask`, which the cookbook does not send). None with `weights`, or
    without same-length `advantages` and `logprobs` (the engine names what is wrong)."""
    if "weights" in inputs or not inputs.keys() >= {"advantages", "logprobs"}:
        return None
    advantages, logprobs = inputs["advantages"]["values"], inputs["logprobs"]["values"]
    if len(advantages) != len(logprobs):
        return None
    return [1.0 if a != 0 or q != 0 else 0.0 for a, q in zip(advantages, logprobs, strict=True)]


def optimizer(body: dict[str, Any]) -> dict[str, Any]:
    """`optim_params` (AdamParams) as Whitney's Optimizer."""
    params = body.get("optim_params", body.get("adam_params", body.get("optimizer_params")))
    if not isinstance(params, dict):
        raise bad("optim_params", "expected AdamParams")
    kind = params.get("type", "adamw")
    if kind != "adamw":
        raise refused("optim_params.type", f"the {kind!r} optimizer (adamw only)")
    keys = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
    unknown = sorted(set(params) - {*keys, "type"})
    if unknown:
        raise bad(f"optim_params.{unknown[0]}", "unknown field")
    return {"optimizer": {key: params[key] for key in keys if key in params}}


def _prompt_tokens(prompt: Any, field: str) -> list[int]:
    if not isinstance(prompt, dict) or not isinstance(prompt.get("chunks"), list):
        raise bad(field, "expected a ModelInput {'chunks': [...]}")
    tokens: list[int] = []
    for index, chunk in enumerate(prompt["chunks"]):
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise refused(f"{field}.chunks[{index}]", f"a {kind!r} chunk (token chunks only)")
        values = chunk.get("tokens")
        if not isinstance(values, list):
            raise bad(f"{field}.chunks[{index}].tokens", "expected a list of token ids")
        tokens.extend(values)
    return tokens


def sample_payloads(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A SampleRequest as Whitney's `sample` payload (its stop strings honoured as the engine
    samples), and a `logprobs` one if it asks for prompt logprobs."""
    for field in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
        if body.get(field):
            raise refused(field, f"{field} (top-k logprobs and alternative tokens)")
    for field in ("target_prompt_logprobs", "prompt_logprobs_last_n"):
        if body.get(field) is not None:
            raise refused(field, field)
    if body.get("record_stability_info"):
        raise refused("record_stability_info", "stability recording (stable_reinforce)")
    tokens = _prompt_tokens(body.get("prompt"), "prompt")
    params = body.get("sampling_params")
    if not isinstance(params, dict):
        raise bad("sampling_params", "expected SamplingParams")
    if params.get("max_tokens") is None:
        raise bad("sampling_params.max_tokens", "is required by the embedded server")
    temperature = params.get("temperature", 1)
    if isinstance(temperature, (int, float)) and temperature <= 0:
        raise refused("sampling_params.temperature", f"temperature {temperature} (greedy)")
    stop = params.get("stop")
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not isinstance(s, str) or not s for s in stop) and any(isinstance(s, str) for s in stop):
        raise bad("sampling_params.stop", "expected stop strings or stop token ids, not both")
    strings = [s for s in stop if isinstance(s, str)]
    top_k = params.get("top_k", -1)
    sampling: dict[str, Any] = {
        "max_tokens": params["max_tokens"],
        "temperature": temperature,
        "top_p": params.get("top_p", 1),
        "top_k": None if top_k == -1 else top_k,
        "stop_token_ids": [] if strings else stop,
        "stop": strings,
        "seed": params.get("seed"),
    }
    sample = {
        "prompt": {"token_ids": tokens},
        "num_samples": body.get("num_samples", 1),
        "sampling_params": sampling,
    }
    logprobs = {"sequences": [{"token_ids": tokens}]} if body.get("prompt_logprobs") else None
    return sample, logprobs


def prompt_logprobs(result: dict[str, Any]) -> list[float | None]:
    return list(result["logprobs"][0])


def checkpoint_path(run_id: str, name: str, sampler: bool) -> str:
    return f"{TINKER_SCHEME}{run_id}/{'sampler_weights' if sampler else 'weights'}/{name}"


def parse_path(path: Any, field: str, sampler: bool) -> tuple[str, str]:
    """The (run id, name) a `tinker://<run>/weights|sampler_weights/<name>` path names."""
    segment = "sampler_weights" if sampler else "weights"
    if not isinstance(path, str) or not path.startswith(TINKER_SCHEME):
        raise bad(field, "expected a tinker:// path this server issued")
    parts = path.removeprefix(TINKER_SCHEME).split("/")
    if len(parts) != 3 or parts[1] != segment or not parts[0] or not parts[2]:
        raise bad(field, f"expected tinker://<model_id>/{segment}/<name>, got {path[:200]!r}")
    return parts[0], parts[2]


def session_id(run_id: str, sampler_id: str, client: str | None = None) -> str:
    """A sampling session's id: the run and sampler it samples, and, for a session created on
    a sampler's path, which SDK client created it (each has its own request ids)."""
    parts = [run_id, sampler_id] if client is None else [run_id, sampler_id, client]
    return SESSION_SEPARATOR.join(parts)


def parse_session(sampling_session_id: Any) -> tuple[str, str]:
    """The run and sampler of a sampling session's id (sampler names never hold the separator)."""
    if not isinstance(sampling_session_id, str) or SESSION_SEPARATOR not in sampling_session_id:
        raise bad("sampling_session_id", "not a sampling session of this server")
    run_id, sampler_id = sampling_session_id.split(SESSION_SEPARATOR)[:2]
    return run_id, sampler_id


def check_lora(lora: Any) -> int:
    """The rank of a LoraConfig; what the engine does not train is refused."""
    if lora is None:
        return 32
    if not isinstance(lora, dict) or not isinstance(lora.get("rank"), int):
        raise bad("lora_config.rank", "expected an integer")
    for part in ("train_unembed", "train_mlp", "train_attn"):
        if lora.get(part) is False:
            raise refused(f"lora_config.{part}", f"{part}=False (the engine trains every part)")
    return int(lora["rank"])
