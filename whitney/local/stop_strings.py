"""Stop strings during sampling: an engine `Watch` that ends a sample at the token whose text
completes one of its request's `sampling_params.stop` strings (that token kept, `stop_reason`
"stop"), so that no token is drawn past it."""

from __future__ import annotations

from typing import Any

from whitney.tokenizers import get_tokenizer


def stop_watch(payloads: list[dict[str, Any]], base_model: str) -> Any | None:
    """The `Watch` of a batch of sample payloads (rows numbered over the payloads in order,
    a payload's samples together; texts decoded by `base_model`'s tokenizer), or None when no
    payload has stop strings."""
    stops: list[tuple[str, ...]] = []
    for payload in payloads:
        strings = tuple(payload["sampling_params"].get("stop") or ())
        stops += [strings] * payload.get("num_samples", 1)
    if not any(stops):
        return None
    decode = get_tokenizer(base_model).decode
    drawn: list[list[int]] = [[] for _ in stops]

    def on_step(step: Any) -> list[int]:
        ended = []
        for row, token, end in zip(step.rows, step.tokens, step.ends, strict=True):
            drawn[row].append(token)
            text = decode(drawn[row]) if end is None and stops[row] else ""
            if any(stop in text for stop in stops[row]):
                ended.append(row)
        return ended

    from whitney.local.engine import Watch  # torch: only once a sample has stop strings

    return Watch(on_step)
