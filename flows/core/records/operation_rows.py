"""One journal operation as a row: its timings, usage and key metrics, and their text."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from whitney import wire


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _seconds(start: Any, end: Any) -> float | None:
    begin, finish = parse_time(start), parse_time(end)
    if begin is None or finish is None:
        return None
    return round((finish - begin).total_seconds(), 6)


def _extra(operation: wire.Operation, name: str) -> Any:
    return (operation.model_extra or {}).get(name)


def duration_s(operation: wire.Operation) -> float | None:
    """Execution time on the server: started_at to finished_at."""
    return _seconds(_extra(operation, "started_at"), operation.finished_at)


def queued_s(operation: wire.Operation) -> float | None:
    """Time between being journaled and starting to run (waiting for earlier seq ids)."""
    return _seconds(operation.submitted_at, _extra(operation, "started_at"))


def _rounded(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def key_metrics(operation: wire.Operation) -> dict[str, Any]:
    """The few numbers of an operation's result worth a glance, by kind."""
    result = operation.result or {}
    kind = operation.kind
    metrics: dict[str, Any] = {}
    if kind in ("forward_backward", "forward"):
        metrics["loss"] = result.get("loss")
        inner = result.get("metrics") or {}
        for name in ("tokens:sum", "kl_sample_train:mean", "clip_fraction:mean"):
            if name in inner:
                metrics[name] = inner[name]
        metrics["datums"] = len(result.get("outputs") or [])
    elif kind == "optim_step":
        inner = result.get("metrics") or {}
        metrics = {"step": result.get("step")} | {
            name: inner[name] for name in ("grad_norm", "learning_rate") if name in inner
        }
    elif kind == "save_weights_for_sampler":
        metrics["sampler_id"] = result.get("sampler_id")
    elif kind == "sample":
        sequences = result.get("sequences") or []
        lengths = [len(sequence.get("tokens") or []) for sequence in sequences]
        metrics["sequences"] = len(sequences)
        metrics["prompt_tokens"] = result.get("prompt_tokens")
        if lengths:
            metrics["mean_length"] = sum(lengths) / len(lengths)
            stopped = sum(sequence.get("stop_reason") == "stop" for sequence in sequences)
            metrics["stopped"] = stopped / len(sequences)
    elif kind == "logprobs":
        metrics["sequences"] = len(result.get("logprobs") or [])
    elif kind in ("save_state", "load_state"):
        metrics = {name: result[name] for name in ("checkpoint", "step") if name in result}
    elif kind == "export_lora":
        metrics = {
            name: result[name] for name in ("artifact_id", "sha256", "bytes") if name in result
        }
    if operation.error:
        metrics["error"] = f"{operation.error.get('type')}: {operation.error.get('message')}"
    return {name: _rounded(value) for name, value in metrics.items() if value is not None}


def operation_row(operation: wire.Operation) -> dict[str, Any]:
    """One operation as a flat record: what `inspect` prints and `--json` holds."""
    return {
        "seq_id": operation.seq_id,
        "kind": operation.kind,
        "sampler_id": operation.sampler_id,
        "status": operation.status,
        "duration_s": duration_s(operation),
        "queued_s": queued_s(operation),
        "submitted_at": operation.submitted_at,
        "started_at": _extra(operation, "started_at"),
        "finished_at": operation.finished_at,
        "usage": {name: int(value) for name, value in operation.usage.items()},
        "metrics": key_metrics(operation),
    }


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def metrics_text(metrics: Mapping[str, Any]) -> str:
    parts = []
    for name, value in metrics.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif name == "sha256" and isinstance(value, str):
            value = value[:16] + "…"
        parts.append(f"{name}={value}")
    return " ".join(parts)
