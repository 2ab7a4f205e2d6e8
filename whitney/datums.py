"""The datum helpers of Whitney's Loop building blocks ("Datum helpers"), to the letter.

A "datum" is one Whitney training example: right-shifted input/target tokens plus whatever
loss-specific tensors your loss_function needs. The completion's last token only ever appears
as a target, never as an input, so input and target_tokens are one token shorter than
prompt_tokens + completion_tokens.
"""

Tensor = dict[str, object]
Datum = dict[str, object]

__all__ = ["Datum", "Tensor", "rl_datum", "sft_datum", "tensor"]


def tensor(dtype: str, values: list[int] | list[float]) -> Tensor:
    """Build one Whitney dense Tensor: {dtype, shape, values}."""
    return {"dtype": dtype, "shape": [len(values)], "values": list(values)}


def _rightshift(prompt_tokens, completion_tokens):
    full = list(prompt_tokens) + list(completion_tokens)
    if len(full) < 2:
        raise ValueError("prompt_tokens + completion_tokens must contain at least two tokens")
    return full[:-1], full[1:], len(prompt_tokens) - 1


def _aligned(pad_len: int, values: list[float]) -> list[float]:
    return [0.0] * pad_len + list(values)


def sft_datum(prompt_tokens: list[int], completion_tokens: list[int]) -> Datum:
    """cross_entropy datum: supervision only over completion_tokens."""
    input_tokens, target_tokens, pad_len = _rightshift(prompt_tokens, completion_tokens)
    weights = _aligned(pad_len, [1.0] * len(completion_tokens))
    return {
        "input": {"token_ids": input_tokens},
        "loss_inputs": {
            "target_tokens": tensor("int64", target_tokens),
            "weights": tensor("float32", weights),
        },
    }


def rl_datum(
    prompt_tokens: list[int],
    sampled_tokens: list[int],
    sampled_logprobs: list[float],
    advantage: float | list[float],
    *,
    clip_low: float | None = None,
    clip_high: float | None = None,
) -> Datum:
    """importance_sampling-family datum: target_tokens/weights/logprobs/advantages,
    all aligned to the same right-shifted, prompt-masked length.

    advantage is either one scalar broadcast across every completion token
    (standard GRPO-family use) or a pre-computed per-token list of the same
    length as sampled_tokens (see kl_adjust_advantages below). clip_low/
    clip_high attach clip_low_threshold/clip_high_threshold tensors — a
    Tinker-Cloud-only mechanism. Pass None for both on Modal; use scalar
    loss_config keys there instead (see each algorithm's section).
    """
    if len(sampled_logprobs) != len(sampled_tokens):
        raise ValueError("sampled_logprobs must have one entry per sampled_tokens element")
    input_tokens, target_tokens, pad_len = _rightshift(prompt_tokens, sampled_tokens)
    completion_len = len(sampled_tokens)
    if isinstance(advantage, (int, float)):
        per_token_advantage = [float(advantage)] * completion_len
    else:
        per_token_advantage = [float(value) for value in advantage]
    loss_inputs: dict[str, Tensor] = {
        "target_tokens": tensor("int64", target_tokens),
        "weights": tensor("float32", _aligned(pad_len, [1.0] * completion_len)),
        "logprobs": tensor("float32", _aligned(pad_len, sampled_logprobs)),
        "advantages": tensor("float32", _aligned(pad_len, per_token_advantage)),
    }
    if clip_low is not None:
        loss_inputs["clip_low_threshold"] = tensor(
            "float32", _aligned(pad_len, [clip_low] * completion_len)
        )
    if clip_high is not None:
        loss_inputs["clip_high_threshold"] = tensor(
            "float32", _aligned(pad_len, [clip_high] * completion_len)
        )
    return {"input": {"token_ids": input_tokens}, "loss_inputs": loss_inputs}
