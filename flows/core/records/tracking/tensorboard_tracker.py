"""TensorBoard: event files written with TensorBoard's own writer and protos (no TensorFlow,
no torch), in `<dir>/tensorboard/<name>-<key>`; a continued run writes a new event file in the
same directory, which TensorBoard reads as one run (`tensorboard --logdir <dir>/tensorboard`).

Metrics are scalars at their cycle, the learning curves an image, the params an HParams
summary and a text table, the summary and the adapter's metadata text.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Mapping
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from flows.core.records.tracking.backend import RunStatus, TrackedRunSpec


def run_directory(spec: TrackedRunSpec) -> Path:
    """The run's directory: the one a run with the same key already has, else a new one."""
    root = spec.directory / "tensorboard"
    found = sorted(root.glob(f"*{spec.key}"))
    return found[0] if found else root / f"{spec.name}-{spec.key}"


def png_size(content: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header chunk."""
    width, height = struct.unpack(">II", content[16:24])
    return width, height


def markdown_table(rows: Mapping[str, str]) -> str:
    lines = ["| name | value |", "| --- | --- |"]
    return "\n".join(lines + [f"| {name} | {value} |" for name, value in rows.items()])


class TensorBoardTracker:
    """An event file in the run's directory; each summary is flushed as it is written."""

    def __init__(self, spec: TrackedRunSpec) -> None:
        self.directory = run_directory(spec)
        self.key = spec.key
        self.writer = EventFileWriter(str(self.directory))
        self.step = 0

    def write(self, summary: summary_pb2.Summary, step: int) -> None:
        self.step = max(self.step, step)
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        self.writer.flush()

    def log_params(self, params: Mapping[str, str]) -> None:
        self.write(hparams_summary.hparams_pb(dict(params), trial_id=self.key), self.step)
        self.write(text_summary.text_pb("params", markdown_table(params)), self.step)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if tags:
            self.write(text_summary.text_pb("tags", markdown_table(tags)), self.step)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        values = [
            summary_pb2.Summary.Value(tag=name, simple_value=value)
            for name, value in metrics.items()
        ]
        self.write(summary_pb2.Summary(value=values), step)

    def log_file(self, name: str, content: bytes) -> None:
        tag = Path(name).stem
        if name.endswith(".png"):
            width, height = png_size(content)
            image = summary_pb2.Summary.Image(
                height=height, width=width, colorspace=3, encoded_image_string=content
            )
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, image=image)])
        elif name.endswith(".json"):
            pretty = json.dumps(json.loads(content), indent=2)
            summary = text_summary.text_pb(tag, f"```\n{pretty}\n```")
        else:
            summary = text_summary.text_pb(tag, content.decode("utf-8"))
        self.write(summary, self.step)

    def finish(self, status: RunStatus) -> None:
        self.write(text_summary.text_pb("status", status), self.step)
        self.writer.close()
