"""What `ctx.client` offers a recipe and a flow: the Loop building blocks' two ordered calls."""

from __future__ import annotations

from typing import Protocol


class OperationClient(Protocol):
    """What `ctx.client` offers a recipe: the Loop building blocks' two ordered calls."""

    def run_operation(
        self, run_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict: ...

    def sampler_operation(
        self, run_id: str, sampler_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict: ...
