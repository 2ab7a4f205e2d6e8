"""The embedded server's request limits: each a `serve` flag with a safe default, listed in
the capabilities document (`limits`), and checked before anything is journaled. A request
over one is refused naming the field, the limit and the value (`LimitExceeded`, 422; the
body size is 413 and the per-tenant caps 429 with Retry-After, in `app`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from whitney.errors import LimitExceeded, RateLimited

PENDING_RETRY_AFTER_S = 1.0
"""Retry-After of a refusal for too many pending operations: they drain as the run works."""


def _limit(default: int, help_line: str) -> Any:
    """A limit's field: its default and what it bounds (its `serve --help` line)."""
    return field(default=default, metadata={"help": help_line})


@dataclass(frozen=True)
class Limits:
    """Every limit, with its default and what it bounds (`LIMIT_HELP`)."""

    max_body_bytes: int = _limit(8 * 1024 * 1024, "bytes in a request body (413 past it)")
    max_datums: int = _limit(1024, "datums in a forward / forward_backward payload")
    max_sequences: int = _limit(1024, "sequences in a logprobs payload")
    max_num_samples: int = _limit(256, "num_samples of a sample payload")
    max_tokens: int = _limit(1024, "sampling_params.max_tokens of a sample payload")
    max_tokens_per_datum: int = _limit(1024, "tokens in one datum or logprobs sequence")
    max_tokens_per_request: int = _limit(
        16384,
        "tokens in one operation: the datums' tokens, the logprobs sequences' tokens, or "
        "num_samples x (prompt + max_tokens)",
    )
    max_tokens_per_sample_batch: int = _limit(
        2048,
        "tokens one batched engine call of ready samples on a sampler decodes, each sample "
        "num_samples x (prompt + max_tokens); more run in several calls, with the same results "
        "(a sample larger than it runs alone)",
    )
    max_labels: int = _limit(32, "labels on a session or a run")
    max_label_chars: int = _limit(256, "characters in a label's key or value")
    max_pending_operations: int = _limit(
        1024,
        "operations a run holds not yet run (ahead of a seq gap, or queued); past it, 429 "
        "with Retry-After",
    )
    seq_window: int = _limit(4096, "how far a seq_id may be ahead of the run's next_seq_id")
    max_requests_per_tenant: int = _limit(
        64, "concurrent requests of one API key (429 with Retry-After past it)"
    )
    max_long_polls_per_tenant: int = _limit(
        256, "concurrent long-polls (wait_s > 0) of one API key (429 with Retry-After past it)"
    )

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{item.name} must be a positive integer, got {value!r}")

    def document(self) -> dict[str, int]:
        """The capabilities document's `limits` object."""
        return asdict(self)


LIMIT_HELP: dict[str, str] = {item.name: item.metadata["help"] for item in fields(Limits)}
"""The `serve --help` line of each limit (docs/api.md and docs/limits.md list the same)."""


def exceeded(field: str, limit_name: str, limit: int, value: int) -> LimitExceeded:
    """The refusal of `value` at `field`, over the limit `limit_name` (= `limit`)."""
    return LimitExceeded(
        f"{field}: {value} is over the server's {limit_name} of {limit}",
        details={"field": field, "limit": limit_name, "max": limit, "value": value},
    )


def check_labels(labels: dict[str, str], limits: Limits, field: str = "labels") -> None:
    """At most `max_labels` labels, each key and value at most `max_label_chars` characters."""
    if len(labels) > limits.max_labels:
        raise exceeded(field, "max_labels", limits.max_labels, len(labels))
    for key, value in labels.items():
        longest = max(len(key), len(value))
        if longest > limits.max_label_chars:
            raise exceeded(
                f"{field}.{key[:32]}", "max_label_chars", limits.max_label_chars, longest
            )


def check_seq_window(seq_id: int, next_seq_id: int, limits: Limits) -> None:
    """A new `seq_id` at most `seq_window` ahead of the run's next_seq_id."""
    if seq_id - next_seq_id >= limits.seq_window:
        raise LimitExceeded(
            f"seq_id: {seq_id} is more than seq_window {limits.seq_window} ahead of the run's "
            f"next_seq_id {next_seq_id}",
            details={
                "field": "seq_id",
                "limit": "seq_window",
                "max": next_seq_id + limits.seq_window - 1,
                "value": seq_id,
            },
        )


def check_pending(pending: int, limits: Limits) -> None:
    """A run holding `max_pending_operations` not yet run takes no more until some ran."""
    if pending >= limits.max_pending_operations:
        raise RateLimited(
            f"seq_id: the run holds {pending} operations not yet run (max_pending_operations "
            f"{limits.max_pending_operations}); resend once some have run",
            details={"field": "seq_id", "limit": "max_pending_operations"},
            retry_after=PENDING_RETRY_AFTER_S,
        )


def check_payload(kind: str, payload: dict[str, Any], limits: Limits) -> None:
    """The size limits of a validated payload (`wire.validate_payload(...).model_dump()`)."""
    if kind in ("forward", "forward_backward"):
        lengths = [len(datum["input"]["token_ids"]) for datum in payload["data"]]
        _check_count("payload.data", "max_datums", limits.max_datums, len(lengths))
        _check_lengths("payload.data[{}].input.token_ids", lengths, limits)
        _check_total("payload.data", sum(lengths), limits)
    elif kind == "logprobs":
        lengths = [len(sequence["token_ids"]) for sequence in payload["sequences"]]
        _check_count("payload.sequences", "max_sequences", limits.max_sequences, len(lengths))
        _check_lengths("payload.sequences[{}].token_ids", lengths, limits)
        _check_total("payload.sequences", sum(lengths), limits)
    elif kind == "sample":
        samples = payload["num_samples"]
        max_tokens = payload["sampling_params"]["max_tokens"]
        prompt = len(payload["prompt"]["token_ids"])
        _check_count("payload.num_samples", "max_num_samples", limits.max_num_samples, samples)
        _check_count(
            "payload.sampling_params.max_tokens", "max_tokens", limits.max_tokens, max_tokens
        )
        _check_lengths("payload.prompt.token_ids", [prompt], limits, indexed=False)
        _check_total("payload.num_samples", sample_tokens(payload), limits)


def sample_tokens(payload: dict[str, Any]) -> int:
    """The tokens a `sample` payload decodes: num_samples x (prompt + max_tokens)."""
    prompt = len(payload["prompt"]["token_ids"])
    return payload["num_samples"] * (prompt + payload["sampling_params"]["max_tokens"])


def _check_count(field: str, limit_name: str, limit: int, value: int) -> None:
    if value > limit:
        raise exceeded(field, limit_name, limit, value)


def _check_lengths(field: str, lengths: list[int], limits: Limits, *, indexed: bool = True) -> None:
    for index, length in enumerate(lengths):
        if length > limits.max_tokens_per_datum:
            name = field.format(index) if indexed else field
            raise exceeded(name, "max_tokens_per_datum", limits.max_tokens_per_datum, length)


def _check_total(field: str, tokens: int, limits: Limits) -> None:
    if tokens > limits.max_tokens_per_request:
        raise exceeded(field, "max_tokens_per_request", limits.max_tokens_per_request, tokens)
