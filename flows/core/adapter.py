"""An exported LoRA adapter, as every flow reports it."""

from __future__ import annotations

from pydantic import BaseModel


class AdapterExport(BaseModel):
    """An exported LoRA adapter on the Whitney server."""

    artifact_id: str
    sha256: str
    bytes: int
    format: str
