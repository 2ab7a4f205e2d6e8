"""The check of a DPO config's reference checkpoint on the Whitney it will run on, before any
session opens (by the CLI, exit 2, and by every flow run): the checkpoint exists under the key,
and its run has the config's base model and LoRA rank (the policy starts from it). No Prefect."""

from __future__ import annotations

from blocks.connection import WhitneyConnection
from flows.core.config import ConfigError
from flows.dpo.config import BASE_REFERENCE, DPOConfig
from whitney.client import WhitneyClient
from whitney.errors import NotFound
from whitney.uris import checkpoint_run_id

FIELD = "reference"


def saved_checkpoints(client: WhitneyClient, run_id: str) -> set[str]:
    """The checkpoint URIs of the run's succeeded `save_state` operations."""
    return {
        str(operation.result["checkpoint"])
        for operation in client.iter_journal(run_id)
        if operation.kind == "save_state"
        and operation.status == "succeeded"
        and (operation.result or {}).get("checkpoint")
    }


def check_reference(config: DPOConfig, connection: WhitneyConnection) -> None:
    """ConfigError naming `reference` if it is a checkpoint this Whitney does not hold for
    the key, or one of another base model or LoRA rank than the config's."""
    if config.reference == BASE_REFERENCE:
        return
    uri = config.reference
    run_id = checkpoint_run_id(uri)
    with connection.get_client() as client:
        try:
            run = client.get_run(run_id)
        except NotFound:
            raise ConfigError(FIELD, f"{uri} does not exist: no run {run_id} here") from None
        if uri not in saved_checkpoints(client, run_id):
            raise ConfigError(FIELD, f"{uri} does not exist: run {run_id} saved no such state")
    if run.base_model != config.base_model or run.lora_rank != config.lora_rank:
        raise ConfigError(
            FIELD,
            f"{uri} is a checkpoint of {run.base_model} at LoRA rank {run.lora_rank}; the "
            f"policy starts from it, so base_model and lora_rank must be those "
            f"(got {config.base_model}, {config.lora_rank})",
        )
