"""Checks the recipe tests make: the provider table as (loss, provider) pairs, and the
payloads the server journaled."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from flows.recipes import CRITIC_PROVIDERS, RECIPES, AuxiliaryRun, Recipe, load_recipe
from flows.recipes.ppo import RECIPE as PPO
from whitney.local import EmbeddedWhitney
from whitney.losses import PROVIDER_LOSS_SUPPORT

PROVIDERS = ("modal", "tinker", "local")


def serves(provider: str, loss: str) -> bool:
    """The provider advertises the loss and offers every run its recipe needs."""
    if loss not in PROVIDER_LOSS_SUPPORT[provider]:
        return False
    recipe = load_recipe(loss)
    return all(
        run.role != "critic" or provider in CRITIC_PROVIDERS for run in recipe.auxiliary_runs
    )


SERVED = [(loss, provider) for loss in RECIPES for provider in PROVIDERS if serves(provider, loss)]
REFUSED = [
    (loss, provider) for loss in RECIPES for provider in PROVIDERS if not serves(provider, loss)
]


def journaled(server: EmbeddedWhitney, run_id: str, kind: str | None = None) -> list[dict]:
    """The run's journaled operations (seq_id, kind, status, executions, payload), in order."""
    path = Path(server.data_dir) / "journal.sqlite3"
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    connection.row_factory = sqlite3.Row
    try:
        rows = connection.execute(
            "SELECT seq_id, kind, status, executions, payload FROM operations WHERE run_id=? "
            "ORDER BY seq_id",
            (run_id,),
        ).fetchall()
    finally:
        connection.close()
    operations = [{**dict(row), "payload": json.loads(row["payload"])} for row in rows]
    return [op for op in operations if kind is None or op["kind"] == kind]


PPO_WITH_CRITIC = Recipe(
    name="ppo+critic",
    loss_function="ppo",
    build_loss=PPO.build_loss,
    auxiliary_runs=(AuxiliaryRun("critic", role="critic"),),
)
"""A recipe whose loss every provider serves, but which needs a critic run."""
